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
- two ``syncthreads`` (the block hand-off and back) with the block's 512 threads;
- the memory-ordering work of a step: a GPU-scope fence alone, a volatile store to device
  memory followed by a fence (what ``post_step`` does to publish a step), a volatile load
  (a counter), a read of ``%globaltimer``;
- ``move`` of one 16-byte step by the whole block (a one-rank copy), and ``move_all``'s
  reduction of two 8-byte inputs (a two-rank one-shot all_reduce's second step).

Run: python3 scripts/probe_step.py [nthreads]   (under the simulator too, slowly)
"""
import sys

import numpy as np
from numba import cuda

from pydfccl.kernels import memory as M
from pydfccl.kernels.plans import ALL_REDUCE, RECV_REDUCE_ALL, plan_step, step_peers
from pydfccl.kernels.primitives import COPY, move, move_all

N = 2000
PARTS = ["plan_step + step_peers", "int64 modulo (runtime divisor)",
         "local state read + write", "two syncthreads", "loop overhead",
         "fence.acq_rel.gpu", "volatile store + fence", "volatile load", "%globaltimer read",
         "move: 16-byte copy, whole block", "move_all: 2 x 8-byte reduce, whole block"]


@cuda.jit
def ordering(out, n, word, data, addrs):
    """The second half of the parts: memory ordering, the clock, and the data moves."""
    tid = cuda.threadIdx.x
    acc = 0
    t = cuda.shared.array(7, np.int64)
    if tid == 0:
        t[0] = M.now_ns()
        for i in range(n):
            M.fence_gpu()
        t[1] = M.now_ns()
        for i in range(n):
            M.store_volatile(word, i)
            M.fence_gpu()
        t[2] = M.now_ns()
        for i in range(n):
            acc += M.load_volatile(word + 8 * (acc & 1))
        t[3] = M.now_ns()
        for i in range(n):
            acc += M.now_ns() & 1
        t[4] = M.now_ns()
    cuda.syncthreads()
    for i in range(n):
        move(0, 4, COPY & ~16, 0, 1, 0, data, 0, data + 16)
    cuda.syncthreads()
    if tid == 0:
        t[5] = M.now_ns()
    for i in range(n):
        move_all(0, 2, RECV_REDUCE_ALL & ~16, 0, 1, 0, addrs, 2, data + 32)
    cuda.syncthreads()
    if tid == 0:
        t[6] = M.now_ns()
        for k in range(6):
            out[k] = t[k + 1] - t[k]
        out[6] = acc


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
    ns = list(out.copy_to_host()[:5])
    from pydfccl.platform import address_of

    word = cuda.to_device(np.zeros(2, np.int64))
    data = cuda.to_device(np.ones(16, np.float32))
    base = address_of(data)
    addrs = cuda.to_device(np.array([base, base + 16], np.int64))
    more = cuda.to_device(np.zeros(7, np.int64))
    args = (np.int64(address_of(word)), np.int64(base), addrs)
    ordering[1, nthreads](more, 10, *args)          # compile and warm
    ordering[1, nthreads](more, n, *args)
    ns += list(more.copy_to_host()[:6])
    print(f"one block of {nthreads} threads, {n} times each (ns per time)")
    for name, total in zip(PARTS, ns):
        print(f"  {name:<42} {total / n:10.1f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 512)
