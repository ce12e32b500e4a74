"""Probe (GPU only): what one thread's memory operations cost, the daemon's thread 0 view.

The daemon's scheduler is a single thread per block whose time goes to memory round trips,
so this times, with %globaltimer in one thread, each kind of access it makes: loads of
device memory (volatile), loads of mapped host memory (volatile, acquire), a host store
followed by a system fence, a system-scope atomic on device memory, and fences at GPU and
system scope. Each load's address depends on the previous load's value, so the loads
cannot overlap.
Run: python3 scripts/probe_memory.py
"""
import numpy as np
from numba import cuda

from pydfccl.kernels import memory as M

N = 2000
OPS = ["ld.volatile device", "ld.volatile host", "ld.acquire.sys host", "st host + fence.sys",
       "atom.add.sys device", "fence.gpu", "fence.sys", "loop overhead"]


@cuda.jit
def probe(out, dev, host, n):
    t0 = M.now_ns()
    v = 0
    for i in range(n):
        v = M.load_volatile(dev + v * 0)
    t1 = M.now_ns()
    for i in range(n):
        v = M.load_volatile(host + v * 0)
    t2 = M.now_ns()
    for i in range(n):
        v = M.load_acquire(host + v * 0)
    t3 = M.now_ns()
    for i in range(n):
        M.store_volatile(host + 8, i)
        M.fence_sys()
    t4 = M.now_ns()
    for i in range(n):
        v += M.atomic_add(dev + 8, 1)
    t5 = M.now_ns()
    for i in range(n):
        M.fence_gpu()
    t6 = M.now_ns()
    for i in range(n):
        M.fence_sys()
    t7 = M.now_ns()
    for i in range(n):
        v += M.now_ns() & 1
    t8 = M.now_ns()
    out[0], out[1], out[2], out[3] = t1 - t0, t2 - t1, t3 - t2, t4 - t3
    out[4], out[5], out[6], out[7] = t5 - t4, t6 - t5, t7 - t6, t8 - t7
    out[8] = v


def main():
    dev = cuda.to_device(np.zeros(2, np.int64))
    host = cuda.mapped_array(2, np.int64)
    host[:] = 0
    dev_addr = np.int64(dev.__cuda_array_interface__["data"][0])
    host_addr = np.int64(host.__cuda_array_interface__["data"][0])
    out = cuda.to_device(np.zeros(9, np.int64))
    for _ in range(2):   # the first launch warms up
        probe[1, 1](out, dev_addr, host_addr, N)
        cuda.synchronize()
    ns = out.copy_to_host()[:8] / N
    print(f"{'one thread, one op':<24} {'ns each':>8}")
    for name, v in zip(OPS, ns):
        print(f"{name:<24} {v:>8.0f}")


if __name__ == "__main__":
    main()
