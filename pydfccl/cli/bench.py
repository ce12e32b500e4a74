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
from dataclasses import dataclass

import numpy as np

from ..bootstrap.group import close_all, init_all, start_all
from ..bootstrap.launch import BACKENDS, launch
from ..errors import PydfcclError
from ..host.gcpause import gc_paused
from ..host.world_config import on_gpu
from ..sched.policies import Policy
from .exits import UsageError
from .options import (add_policy_options, check_backend, check_world_sizes, chosen_policy,
                      policy_name, where)

__all__ = ["LatencyOptions", "latency_worker", "one_thread_latency", "group_order",
           "measure_latency", "latency_modes", "run_latency", "format_rows", "build_parser",
           "main"]

BASELINE = "kernel launch per call"


@dataclass(frozen=True)
class LatencyOptions:
    nranks: int = 2
    iters: int = 50
    warmup: int = 5
    count: int = 2
    dtype: str = "float32"
    colls: int = 1
    policy: Policy | str = "dfccl"    # the daemon's: an object (with --param's) or a name
    baseline: bool = True             # also the launch-per-collective baseline
    backend: str | None = None
    nthreads: int | None = None
    nblocks: int | None = None


def _input(rank: int, count: int, dtype: str) -> np.ndarray:
    return np.full(count, rank + 1, dtype=dtype)


def _check(y, rank: int, nranks: int, count: int, dtype: str) -> None:
    """The all-reduce of every rank's ``_input``: 1 + 2 + ... + nranks everywhere."""
    got = np.asarray(y)
    if not np.array_equal(got, np.full(count, nranks * (nranks + 1) // 2, dtype=dtype)):
        raise AssertionError(f"rank {rank}: wrong all-reduce result {got[:4]}...")


def _prepare(comm, colls: int, count: int, dtype: str) -> list:
    """Register ``colls`` all-reduces; their (send, recv) buffers, inputs filled in."""
    for k in range(colls):
        comm.prepare(k, "all_reduce", count=count, dtype=dtype)
    pairs = [(comm.empty(count, dtype), comm.empty(count, dtype)) for _ in range(colls)]
    for x, _ in pairs:
        x[...] = _input(comm.rank, count, dtype)
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
    them (seen on the H200: when the watchdog fired, rank 0 had its 64 submitted and no
    peer any). The daemon takes either order."""
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


def latency_modes(opts: LatencyOptions) -> list[tuple]:
    """(name, policy, persistent) of each mode measured: the daemon under the policy given,
    and unless left out the baseline, a kernel launched per collective (the nccl policy's
    code)."""
    modes = [(f"daemon ({policy_name(opts.policy)})", opts.policy, True)]
    if opts.baseline:
        modes.append((BASELINE, "nccl", False))
    return modes


def run_latency(opts: LatencyOptions, drivers=("threads",), on_driver=None) -> list[dict]:
    """Every mode under every driver: a row each, ``dict(driver, mode, result)`` or, where
    the measurement failed with a pydfccl error (a baseline's deadlock), ``dict(driver,
    mode, error)`` with the error's first line. ``on_driver(rows)`` gets each driver's rows
    as soon as they are measured."""
    rows = []
    for driver in drivers:
        mine = []
        for name, policy, persistent in latency_modes(opts):
            try:
                result = measure_latency(opts.nranks, opts.iters, opts.warmup, opts.count,
                                         opts.dtype, policy, persistent, opts.backend, driver,
                                         opts.colls, opts.nthreads, opts.nblocks)
                mine.append(dict(driver=driver, mode=name, result=result))
            except PydfcclError as exc:
                mine.append(dict(driver=driver, mode=name, error=str(exc).splitlines()[0]))
        if on_driver is not None:
            on_driver(mine)
        rows += mine
    return rows


HEADER = (f"{'driver':<8} {'mode':<24} {'median us':>10} {'p10 us':>8} {'p90 us':>8} "
          f"{'x baseline':>10} {'in run() us':>11} {'launches':>9}")


def format_rows(rows: list[dict]) -> str:
    """One driver's rows of the table under HEADER, with the time over the baseline's."""
    base = next((r["result"] for r in rows if r["mode"] == BASELINE and "result" in r), None)
    lines = []
    for row in rows:
        d, name = row["driver"], row["mode"]
        if "error" in row:
            lines.append(f"{d:<8} {name:<24} failed: {row['error']}")
            continue
        r = row["result"]
        launches = sum(s["launches"] for s in r["stats"])
        ratio = f"{r['median'] / base['median']:>10.2f}" if base else f"{'-':>10}"
        lines.append(f"{d:<8} {name:<24} {r['median']:>10.1f} {r['p10']:>8.1f} "
                     f"{r['p90']:>8.1f} {ratio} {r['submit']:>11.1f} {launches:>9}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl bench latency",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    gpu = on_gpu()
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


def _options(args: argparse.Namespace) -> tuple[LatencyOptions, dict]:
    """The options, and --param's overrides (for the headline)."""
    policy, overrides = chosen_policy(args)
    if min(args.nranks, args.iters, args.count, args.colls) < 1 or args.warmup < 0:
        raise UsageError("--nranks, --iters, --count and --colls must be at least 1, "
                         "--warmup at least 0")
    check_backend(args.backend)
    check_world_sizes(args.nranks, flags={"max_colls": "-k/--colls"},
                      **_sizes(args.colls, args.nthreads, args.nblocks))
    return LatencyOptions(nranks=args.nranks, iters=args.iters, warmup=args.warmup,
                          count=args.count, dtype=args.dtype, colls=args.colls, policy=policy,
                          baseline=not args.no_baseline, backend=args.backend,
                          nthreads=args.nthreads, nblocks=args.nblocks), overrides


def _drivers(choice: str | None) -> tuple:
    gpu = on_gpu()
    if choice in ("one", "both") and not gpu:
        raise UsageError(f"--driver {choice} needs a GPU (one thread drives every rank "
                         "through init_all)")
    choice = choice or ("both" if gpu else "threads")
    return ("threads", "one") if choice == "both" else (choice,)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    opts, overrides = _options(args)
    drivers = _drivers(args.driver)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    nbytes = opts.count * np.dtype(opts.dtype).itemsize
    together = (f"{opts.colls} all-reduces submitted together" if opts.colls > 1 else
                "all-reduce")
    print(f"{together} latency on the {where()}: {opts.nranks} ranks, {nbytes} bytes each, "
          f"{opts.iters} runs after {opts.warmup} warm-up, submit to future completion"
          + "".join(f", {k}={v}" for k, v in overrides.items()))
    print(HEADER, flush=True)
    rows = run_latency(opts, drivers, on_driver=lambda mine: print(format_rows(mine),
                                                                   flush=True))
    return 1 if any("error" in r for r in rows) else 0
