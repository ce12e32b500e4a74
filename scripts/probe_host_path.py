"""Probe (any machine, the CUDA simulator included): what a run costs the host alone.

The daemon is replaced by an echo: a compiled loop, off the GIL, that completes every SQ
entry as soon as it appears (its CQ entry, stamp last), and quits after 5 ms with nothing
to do, as a daemon would; pydfccl's launch loop relaunches it. So a run's time here is
pydfccl's Python from ``run()`` to ``result()`` plus the echo's reaction (a compiled spin:
under a microsecond when it has a core to itself), without a GPU: the host's share of the
small-message latency, to measure and profile on a CPU; it prints the time inside ``run()``
and inside ``result()`` apart as well. Under the simulator the buffers are
numpy arrays, whose check is not cached as a Numba device array's is, so ``run()`` costs
more here than with a GPU. On the 2-core development machine (2026-11-30, 1 rank) the
median moved from 33 to 102 us between runs of the same code: a host with cores to spare
(the H200's) is the place to compare changes.
Run: NUMBA_ENABLE_CUDASIM=1 python3 scripts/probe_host_path.py [--iters N] [--profile]
"""
import argparse
import cProfile
import os
import pstats
import time

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

import pydfccl
from pydfccl.protocol import layout as L
from pydfccl import platform
from pydfccl.host.communicator import CollectiveFuture
from pydfccl.host.hostspin import _load_acquire_i64 as _load

SQ_SEQ, SQ_COLL = L.CTL_SQ + L.SQ_F["seq"], L.CTL_SQ + L.SQ_F["coll"]
CQ_STAMP, CQ_COLL = L.CTL_CQ + L.CQ_F["stamp"], L.CTL_CQ + L.CQ_F["coll"]


@intrinsic
def _store(typingctx, addr, value):
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.PointerType(ir.IntType(64)))
        builder.store_atomic(args[1], ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


@njit(nogil=True)   # not cached: Numba's cache would keep layout.py's offsets of its day
def echo(ctl, frontier, quit_after_ns):
    """Complete SQ entries from ``frontier`` on until none came for ``quit_after_ns``;
    return the new frontier."""
    spins = 0
    while True:
        slot = frontier % L.SQ_CAP
        if _load(ctl + SQ_SEQ + slot * L.SQ_SIZE) == frontier + 1:
            coll = _load(ctl + SQ_COLL + slot * L.SQ_SIZE)
            cq = frontier % L.CQ_CAP
            _store(ctl + CQ_COLL + cq * L.CQ_SIZE, coll)
            _store(ctl + CQ_STAMP + cq * L.CQ_SIZE, frontier + 1)
            frontier += 1
            spins = 0
        else:
            spins += 1
            if spins * 4 > quit_after_ns:      # a look takes a few nanoseconds
                return frontier


_frontiers = {}


def echo_launch(configured, args):
    ctl = int(args[0])
    _frontiers[ctl] = echo(ctl, _frontiers.get(ctl, 0), 5_000_000)


def worker(comm, iters, profile):
    platform.launch = echo_launch       # every launch of this process is the echo
    # result() spins as it does on a GPU (the simulator's waiters sleep at once: there a
    # collective takes milliseconds of CPU that a spinning waiter would only slow)
    CollectiveFuture.SPIN_SECONDS = 1e-3
    comm.prepare(0, "all_reduce", count=2, dtype="float32")
    comm.start()
    x, y = comm.empty(2, "float32"), comm.empty(2, "float32")
    times = np.empty((iters, 2))               # run(), then result()
    for _ in range(200):                       # warm-up
        comm.run(0, x, y).result(timeout=30)
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    for i in range(iters):
        t0 = time.perf_counter()
        future = comm.run(0, x, y)
        t1 = time.perf_counter()
        future.result(timeout=30)
        times[i] = t1 - t0, time.perf_counter() - t1
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats(os.environ.get("PROBE_SORT", "tottime")).print_stats(30)
    return times * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    (times,) = pydfccl.launch(worker, 1, args=(args.iters, args.profile))
    total = times.sum(axis=1)
    print(f"run() to result(), host only (echo daemon), {args.iters} runs: median "
          f"{np.median(total):.1f} us, p10 {np.percentile(total, 10):.1f}, "
          f"p90 {np.percentile(total, 90):.1f}; inside run() {np.median(times[:, 0]):.1f}, "
          f"inside result() {np.median(times[:, 1]):.1f}")


if __name__ == "__main__":
    main()
