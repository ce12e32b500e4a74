"""Probe (GPU only): the floor under issue 5's small-message target, with no pydfccl in it.

The target is an 8-byte all-reduce from Python, submit to completion, on ranks that are
threads of one process. This times the least any such design can do here: per rank one
persistent kernel (one thread working, own stream) that watches a word in mapped host
memory, trades its 8 bytes with every peer through device memory (one flag each way) and
writes the sum and a completion word to mapped host memory; one Python thread writes every
rank's submission word, then spins on every rank's completion word. No futures, no queue, no
scheduling, no preemption: what remains is Python's own stores and loads, the PCIe round
trip and one flag exchange between kernels. Every result is checked.

Reads of mapped host memory from several multiprocessors wait on each other, so each rank
reading its own word may not be the least. ``--relay`` adds a second design: one warp of a
poller kernel reads every rank's submission word at once (lane r reads rank r's, the words
side by side) and copies what changed to a word in device memory, which the rank's kernel
watches instead. Each table row names its design.
Run: python3 scripts/probe_floor.py [--ranks 1 2 8] [--iters 10000] [--relay]
"""
import argparse
import time

import numpy as np
from numba import cuda

from pydfccl.kernels import memory as M

STOP = -1
SPINS_BEFORE_LOOKING = 1024   # peer waits look for the host's stop word this often


@cuda.jit
def relay(sq, go, nranks):
    """Lane r of one warp: copy each new value of rank r's host word sq[r] to go[r] in device
    memory, so that the host words cross PCIe in one read for all ranks."""
    lane = cuda.threadIdx.x
    if lane >= nranks:
        return
    seen = 0
    while seen != STOP:
        k = M.load_acquire(sq + lane * 8)
        if k != seen:
            M.store_release(go + lane * 8, k)
            seen = k


@cuda.jit
def rank_loop(watch, cq, cq_sum, inbox, flags, rank, nranks):
    """Thread 0 of rank ``rank``'s kernel: for each new submission ``k`` (the word
    watch[rank]: the host's sq, or the relay's copy), send ``k * (rank + 1)`` to every peer,
    wait for theirs, and post the sum and ``k``."""
    if cuda.threadIdx.x != 0:
        return
    done = 0
    while True:
        k = M.load_acquire(watch + rank * 8)
        if k == done:
            continue
        if k == STOP:
            return
        value = k * (rank + 1)
        for p in range(nranks):
            if p != rank:
                M.store_volatile(inbox + (p * nranks + rank) * 8, value)
        M.fence_gpu()
        for p in range(nranks):
            if p != rank:
                M.store_volatile(flags + (p * nranks + rank) * 8, k)
        total = value
        for p in range(nranks):
            if p != rank:
                spins = 0
                while M.load_volatile(flags + (rank * nranks + p) * 8) != k:
                    spins += 1
                    if spins % SPINS_BEFORE_LOOKING == 0:
                        if M.load_volatile(watch + rank * 8) == STOP:
                            return
        M.fence_gpu()
        for p in range(nranks):
            if p != rank:
                total += M.load_volatile(inbox + (rank * nranks + p) * 8)
        M.store_volatile(cq_sum + rank * 8, total)
        M.fence_sys()
        M.store_volatile(cq + rank * 8, k)
        done = k


def _address(array) -> np.int64:
    return np.int64(array.__cuda_array_interface__["data"][0])


def measure(nranks: int, iters: int, warmup: int, relayed: bool) -> np.ndarray:
    """Microseconds from the first submission store to the last completion seen, per run."""
    sq, cq, cq_sum = (cuda.mapped_array(nranks, np.int64) for _ in range(3))
    for a in (sq, cq, cq_sum):
        a[:] = 0
    inbox, flags, go = (cuda.to_device(np.zeros(n, np.int64))
                        for n in (nranks * nranks, nranks * nranks, nranks))
    streams = [cuda.stream() for _ in range(nranks + 1)]
    watch = go if relayed else sq
    if relayed:
        relay[1, 32, streams[nranks]](_address(sq), _address(go), np.int64(nranks))
    args = [_address(a) for a in (watch, cq, cq_sum, inbox, flags)]
    for r in range(nranks):
        rank_loop[1, 32, streams[r]](*args, np.int64(r), np.int64(nranks))
    want_factor = nranks * (nranks + 1) // 2
    times = np.empty(iters)
    try:
        for i in range(warmup + iters):
            k = i + 1
            deadline = time.perf_counter() + 10.0
            t0 = time.perf_counter_ns()
            for r in range(nranks):
                sq[r] = k
            for r in range(nranks):
                while cq[r] != k:
                    if time.perf_counter() > deadline:
                        raise RuntimeError(f"{nranks} ranks: run {k} not completed by rank "
                                           f"{r} in 10 s (are the kernels concurrent?)")
            t1 = time.perf_counter_ns()
            wrong = [r for r in range(nranks) if cq_sum[r] != k * want_factor]
            if wrong:
                raise RuntimeError(f"{nranks} ranks: run {k} summed wrong on ranks {wrong}")
            if i >= warmup:
                times[i - warmup] = (t1 - t0) / 1e3
    finally:
        sq[:] = STOP
        cuda.synchronize()
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 8])
    ap.add_argument("--iters", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--relay", action="store_true",
                    help="also time the design with one poller warp for every rank's word")
    args = ap.parse_args()
    print(f"8-byte all-reduce floor from one Python thread, {args.iters} runs "
          f"(no futures, no queue, no scheduling)")
    print(f"{'design':>12} {'ranks':>5} {'median us':>10} {'p10 us':>8} {'p90 us':>8}")
    for relayed in (False, True) if args.relay else (False,):
        for n in args.ranks:
            t = measure(n, args.iters, args.warmup, relayed)
            p10, med, p90 = np.percentile(t, [10, 50, 90])
            design = "relay" if relayed else "rank reads"
            print(f"{design:>12} {n:>5} {med:>10.2f} {p10:>8.2f} {p90:>8.2f}")


if __name__ == "__main__":
    main()
