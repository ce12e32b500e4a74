"""Probe (GPU only): how finely does the daemon's clock (%globaltimer) tick, and how long
is one spin of its wait loop?

Prints the steps the clock shows between consecutive reads in one thread, and the
nanoseconds per iteration of a loop of acquire loads plus the back-off (nanosleep), the
daemon's spin. Run: python3 scripts/probe_timer.py
"""
import time

import numpy as np
from numba import cuda

from pydfccl.kernels import memory as M


@cuda.jit
def steps(out, n, addr):
    prev = M.now_ns()
    k = 0
    for i in range(n):
        M.load_acquire(addr)
        M.backoff()
        t = M.now_ns()
        if t != prev and k < out.size:
            out[k] = t - prev
            k += 1
        prev = t


def main():
    flag = cuda.to_device(np.zeros(1, np.int64))
    addr = np.int64(flag.__cuda_array_interface__["data"][0])
    out = cuda.to_device(np.zeros(4096, np.int64))
    n = 200_000
    steps[1, 1](out, n, addr)
    cuda.synchronize()
    t0 = time.perf_counter()
    steps[1, 1](out, n, addr)
    cuda.synchronize()
    dt = time.perf_counter() - t0
    d = out.copy_to_host()
    d = d[d > 0]
    print(f"%globaltimer: {len(d)} distinct steps; min {d.min()} median {int(np.median(d))} "
          f"max {d.max()} (timer units); spin loop {1e9 * dt / n:.1f} ns per iteration")


if __name__ == "__main__":
    main()
