"""Probe (GPU): what the daemon's thread 0 spends on one step's bookkeeping.

On the H200 an 8-byte all-reduce step took about 5 us on each rank (probe_latency's event
log, 2026-11-29), far more than its memory round trips (probe_memory). What remains is
code: thread 0 alone computes each step's plan, peers and connector addresses in 64-bit
integers (divisions and modulos by runtime values are long instruction sequences on a GPU)
and keeps its state in a local array, while the block waits at two barriers a step. This
times each part with %globaltimer, N times in a row, in one block of the daemon's size:

- the step's plan and peers (``plan_step`` and ``step_peers`` for an all_reduce, as
  ``schedule`` calls them);
- one 64-bit modulo by a runtime value;
- a read and write of the scheduler's local state array;
- two ``syncthreads`` (the block hand-off and back) with the block's 512 threads.

Run: python3 scripts/probe_step.py [nthreads]   (under the simulator too, slowly)
"""
import sys

import numpy as np
from numba import cuda

from pydfccl.kernels import memory as M
from pydfccl.kernels.plans import ALL_REDUCE, plan_step, step_peers

N = 2000
PARTS = ["plan_step + step_peers", "int64 modulo (runtime divisor)",
         "local state read + write", "two syncthreads", "loop overhead"]


@cuda.jit
def probe(out, n, nranks, divisor):
    tid = cuda.threadIdx.x
    st = cuda.local.array(33, np.int64)
    for i in range(33):
        st[i] = i
    acc = 0
    t = cuda.shared.array(6, np.int64)
    if tid == 0:
        t[0] = M.now_ns()
        for i in range(n):
            step = (acc + i) & 3
            flags, a, b, m = plan_step(ALL_REDUCE, 1, nranks, 0, 1 << 20, 0, 1 << 18,
                                       i & 7, step, 1024)
            to, frm, conn = step_peers(ALL_REDUCE, 1, nranks, 0, step)
            acc += flags + a + b + m + to + frm + conn
        t[1] = M.now_ns()
        for i in range(n):
            acc += (acc + i) % divisor
        t[2] = M.now_ns()
        for i in range(n):
            k = (acc + i) & 31
            st[k] = st[k + 1] + 1
            acc += st[k]
        t[3] = M.now_ns()
    cuda.syncthreads()
    if tid == 0:
        t[4] = M.now_ns()
    for i in range(n):
        cuda.syncthreads()
        cuda.syncthreads()
    if tid == 0:
        t[5] = M.now_ns()
        t0 = M.now_ns()
        for i in range(n):
            acc += i & 1
        loop = M.now_ns() - t0
        out[0] = t[1] - t[0]
        out[1] = t[2] - t[1]
        out[2] = t[3] - t[2]
        out[3] = t[5] - t[4]
        out[4] = loop
        out[5] = acc


def main(nthreads=512):
    n = 20 if M.SIMULATOR else N      # the simulator runs each thread in Python
    out = cuda.to_device(np.zeros(6, np.int64))
    probe[1, nthreads](out, 10, 4, 7)      # compile and warm
    probe[1, nthreads](out, n, 4, 7)
    ns = out.copy_to_host()
    print(f"one block of {nthreads} threads, {n} times each (ns per time)")
    for name, total in zip(PARTS, ns[:5]):
        print(f"  {name:<34} {total / n:10.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 512)
