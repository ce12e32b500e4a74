"""Latency benchmark: small all-reduces, submit to future completion, from Python.

``--colls K`` submits K collectives together each iteration and waits for all of them
(issue 5's "many at once": 64 concurrent 4 KiB all-reduces, ``--colls 64 --count 1024``);
the baseline then launches a kernel for each. Measured in the same run: pydfccl's
persistent daemon (the policy given) and the launch-per-collective baseline (the same
kernel code, launched once per collective, no daemon), each with a Python thread per rank
(``launch``) and, on a GPU, with one thread
driving every rank (``init_all``). This is a benchmark, not a test: it prints a table and
asserts only that every result was right.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .. import platform
from ..errors import PydfcclError
from ..host.gcpause import gc_paused
from ..bootstrap.group import close_all, init_all, start_all
from ..bootstrap.launch import BACKENDS, launch
from .options import add_policy_options, chosen_policy

__all__ = ["latency_worker", "measure_latency", "main"]


def _input(rank: int, count: int, dtype: str) -> np.ndarray:
    return np.full(count, rank + 1, dtype=dtype)


def _check(y, rank: int, nranks: int, count: int, dtype: str) -> None:
    """The all-reduce of every rank's ``_input``: 1 + 2 + ... + nranks everywhere."""
    got = platform.to_numpy(y, dtype)
    if not np.array_equal(got, np.full(count, nranks * (nranks + 1) // 2, dtype=dtype)):
        raise AssertionError(f"rank {rank}: wrong all-reduce result {got[:4]}...")


def _prepare(comm, colls: int, count: int, dtype: str) -> list:
    """Register ``colls`` all-reduces; their (send, recv) buffers, inputs filled in."""
    for k in range(colls):
        comm.prepare(k, "all_reduce", count=count, dtype=dtype)
    pairs = [(comm.empty(count, dtype), comm.empty(count, dtype)) for _ in range(colls)]
    for x, _ in pairs:
        platform.copy_in(x, _input(comm.rank, count, dtype))
    return pairs


def _timed_iterations(submit, nruns: int, iters: int, warmup: int) -> tuple:
    """Run ``warmup + iters`` iterations, each ``submit()`` (a list of ``nruns`` futures)
    then a wait for all of them, with the collector paused; the timed iterations' seconds
    from submit to the last completion, and their seconds in ``run()`` per run."""
    times, in_run = np.empty(iters), np.empty(iters)
    with gc_paused():
        for i in range(warmup + iters):
            t0 = time.perf_counter()
            futures = submit()
            t1 = time.perf_counter()
            for future in futures:
                future.result(timeout=60)
            if i >= warmup:
                times[i - warmup] = time.perf_counter() - t0
                in_run[i - warmup] = (t1 - t0) / nruns
    return times, in_run


def latency_worker(comm, iters: int, warmup: int, count: int, dtype: str,
                   colls: int = 1) -> dict:
    pairs = _prepare(comm, colls, count, dtype)
    comm.start()
    times, submit = _timed_iterations(
        lambda: [comm.run(k, x, y) for k, (x, y) in enumerate(pairs)], colls, iters, warmup)
    for _, y in pairs:
        _check(y, comm.rank, comm.nranks, count, dtype)
    return dict(times_us=times * 1e6, submit_us=submit * 1e6, stats=comm.stats())


def one_thread_latency(nranks: int, iters: int, warmup: int, count: int, dtype: str,
                       policy, persistent: bool, colls: int = 1,
                       nthreads: int | None = None, nblocks: int | None = None) -> dict:
    """The same runs with one thread driving every rank (``init_all``): each iteration
    submits on all ranks, then waits for all; no GIL hand-offs between rank threads."""
    comms = init_all(nranks, policy=policy, persistent=persistent,
                     **_sizes(colls, nthreads, nblocks))
    try:
        pairs = [_prepare(comm, colls, count, dtype) for comm in comms]
        start_all(comms)
        runs = group_order(comms, pairs)
        times, submit = _timed_iterations(
            lambda: [comm.run(k, x, y) for comm, k, x, y in runs], len(runs), iters, warmup)
        for rank, mine in enumerate(pairs):
            for _, y in mine:
                _check(y, rank, nranks, count, dtype)
        stats = [comm.stats() for comm in comms]
    finally:
        close_all(comms)
    return _summary(times * 1e6, np.median(submit) * 1e6, stats)


def group_order(comms: list, pairs: list) -> list:
    """(comm, coll, send, recv) in the order one thread must issue launch-per-call runs:
    every rank's k-th collective before any rank's (k+1)-th, as an NCCL group does. Rank by
    rank instead, rank 0's launches queue behind its first kernel, which spins for peers
    that are not submitted yet, and a full launch queue blocks the thread that would submit
    them (the H200 call of 2026-11-29 22:38: when the watchdog fired, rank 0 had its 64
    submitted and no peer any). The daemon takes either order."""
    return [(comm, k, *pairs[rank][k]) for k in range(len(pairs[0]))
            for rank, comm in enumerate(comms)]


def _sizes(colls: int, nthreads: int | None, nblocks: int | None) -> dict:
    """World sizes for ``colls`` collectives (the defaults hold 16 on the simulator),
    ``nblocks`` blocks of ``nthreads`` (None: the default)."""
    sizes = {"max_colls": colls} if colls > 16 else {}
    for name, value in (("nthreads", nthreads), ("nblocks", nblocks)):
        if value is not None:
            sizes[name] = value
    return sizes


def _summary(times_us, submit_us, stats) -> dict:
    return dict(median=float(np.median(times_us)), p10=float(np.percentile(times_us, 10)),
                p90=float(np.percentile(times_us, 90)), submit=float(submit_us), stats=stats)


def measure_latency(nranks: int, iters: int, warmup: int, count: int, dtype: str, policy,
                    persistent: bool, backend=None, driver: str = "threads",
                    colls: int = 1, nthreads: int | None = None,
                    nblocks: int | None = None) -> dict:
    if driver == "one":
        return one_thread_latency(nranks, iters, warmup, count, dtype, policy, persistent,
                                  colls, nthreads, nblocks)
    per_rank = launch(latency_worker, nranks, policy=policy, backend=backend,
                      persistent=persistent, args=(iters, warmup, count, dtype, colls),
                      **_sizes(colls, nthreads, nblocks))
    times = np.max([r["times_us"] for r in per_rank], axis=0)   # a run ends on its slowest rank
    submit = np.median([r["submit_us"] for r in per_rank])   # time inside run(), all ranks
    return _summary(times, submit, [r["stats"] for r in per_rank])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl bench latency",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gpu = platform.gpu_available()
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=10000 if gpu else 50)
    p.add_argument("-w", "--warmup", type=int, default=200 if gpu else 5)
    p.add_argument("-c", "--count", type=int, default=2, help="elements (2 x float32 = 8 bytes)")
    p.add_argument("-d", "--dtype", default="float32")
    p.add_argument("-k", "--colls", type=int, default=1,
                   help="all-reduces submitted together per iteration (each its own "
                        "collective; 64 with --count 1024: 64 concurrent 4 KiB all-reduces)")
    add_policy_options(p)
    p.add_argument("--backend", choices=BACKENDS, default=None)
    p.add_argument("--nthreads", type=int, default=None,
                   help="threads per daemon block (WorldConfig; default: the machine's)")
    p.add_argument("--nblocks", type=int, default=None,
                   help="daemon blocks (channels) a rank (WorldConfig; default: the machine's)")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="set sys.setswitchinterval (seconds) for this run")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the launch-per-collective baseline")
    p.add_argument("--driver", choices=("threads", "one", "both"), default=None,
                   help="threads: a Python thread per rank (pydfccl.launch); one: one thread "
                        "drives every rank (pydfccl.init_all, GPU only); default: both on a "
                        "GPU, threads on the simulator")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    policy, _ = chosen_policy(args)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    nbytes = args.count * np.dtype(args.dtype).itemsize
    where = "GPU" if platform.gpu_available() else "CUDA simulator (CPU)"
    together = f"{args.colls} all-reduces submitted together" if args.colls > 1 else "all-reduce"
    print(f"{together} latency on the {where}: {args.nranks} ranks, {nbytes} bytes each, "
          f"{args.iters} runs after {args.warmup} warm-up, submit to future completion"
          + "".join(f", {item}" for item in args.param))
    driver = args.driver or ("both" if platform.gpu_available() else "threads")
    drivers = ("threads", "one") if driver == "both" else (driver,)
    print(f"{'driver':<8} {'mode':<24} {'median us':>10} {'p10 us':>8} {'p90 us':>8} "
          f"{'x baseline':>10} {'in run() us':>11} {'launches':>9}", flush=True)
    failed = 0
    for d in drivers:   # each driver's rows as soon as they are measured
        modes = [("daemon (" + args.policy + ")", policy, True)]
        if not args.no_baseline:
            modes.append(("kernel launch per call", "nccl", False))
        results = {}
        for name, policy, persistent in modes:
            try:
                results[name] = measure_latency(args.nranks, args.iters, args.warmup,
                                                args.count, args.dtype, policy, persistent,
                                                args.backend, d, args.colls, args.nthreads,
                                                args.nblocks)
            except PydfcclError as exc:
                failed += 1
                print(f"{d:<8} {name:<24} failed: {str(exc).splitlines()[0]}", flush=True)
        base = results.get("kernel launch per call")
        for name, r in results.items():
            launches = sum(s["launches"] for s in r["stats"])
            ratio = f"{r['median'] / base['median']:>10.2f}" if base else f"{'-':>10}"
            print(f"{d:<8} {name:<24} {r['median']:>10.1f} {r['p10']:>8.1f} {r['p90']:>8.1f} "
                  f"{ratio} {r['submit']:>11.1f} {launches:>9}", flush=True)
    return 1 if failed else 0
