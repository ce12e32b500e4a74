"""The chaos demo (the main job): collectives submitted in a different order on every rank.

Each iteration, every rank submits the same K all-reduces in its own permutation, chosen so
that no two ranks submit the same collective at the same position (100% disorder), then
waits for all of them (the sync). With ``--sync device`` a rank also calls a device-wide
synchronize after every submission, which NCCL-style execution cannot survive. Every result
is checked against numpy. With ``--policy nccl`` the watchdog reports the deadlock.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

from ..bootstrap.launch import BACKENDS, launch
from ..bootstrap.mpi import current_group, run_in_group
from ..errors import DeadlockError, RankFailedError
from ..host.trace import (MARK_RESULT, MARK_RUN, MARK_SUBMITTING, clock_offset_ns, host_mark,
                          on_daemon_clock, to_chrome)
from ..host.world_config import on_gpu
from ..protocol.codes import COLLECTIVE_KINDS, PER_PEER_COUNTS
from ..protocol.reference import buffer_elems
from ..sched.policies import Policy
from . import replay as schedule_replay
from .chaos_buffers import ChaosBuffers, split_matrix
from .exits import UsageError
from .status_lines import StatusPrinter
from ..transport.summary import net_stats, transports_line
from .pictures import MARK_DEADLOCK, draw_timeline, draw_wait_graph
from .options import (add_policy_options, check_backend, check_world_sizes, chosen_policy,
                      options_record, policy_label, policy_name, where)

__all__ = ["DemoOptions", "chaos_orders", "check_demo", "parse_kinds", "chaos_worker",
           "run_demo", "headline", "summarize", "timeline_names",
           "write_trace", "build_parser", "main"]

EXIT_FAILED, EXIT_DEADLOCK = 1, 3
KINDS = COLLECTIVE_KINDS + PER_PEER_COUNTS      # the demo gives an all_to_allv its counts


@dataclass(frozen=True)
class DemoOptions:
    nranks: int
    colls: int = 8
    iters: int = 20
    count: int = 1000
    dtype: str = "float32"
    policy: Policy | str = "dfccl"     # an object (with --param's overrides) or a name
    sync: str = "none"
    seed: int = 0
    in_order: bool = False
    align: bool = False
    progress: bool = True
    result_timeout: float = 300.0
    status_every: float = 0.0
    kinds: tuple = ("all_reduce",)
    trace: bool = False


def chaos_orders(ncolls: int, nranks: int, rng: np.random.Generator) -> list[list[int]]:
    """One submission order per rank; position j holds a different collective on every rank
    (a Latin rectangle: a random base order, cyclically shifted by a distinct amount per rank)."""
    if nranks > ncolls:
        raise ValueError(f"100% disorder needs at least as many collectives ({ncolls}) as ranks "
                         f"({nranks})")
    base = rng.permutation(ncolls)
    shifts = rng.choice(ncolls, size=nranks, replace=False)
    return [[int(base[(j + s) % ncolls]) for j in range(ncolls)] for s in shifts]


def parse_kinds(text: str) -> tuple:
    """``--kinds``: comma-separated collective kinds, or 'all'; ValueError names unknown
    ones."""
    kinds = tuple(KINDS) if text == "all" else tuple(k.strip() for k in text.split(","))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown collective kind(s) {unknown}; choose from {list(KINDS)} "
                         "or 'all'")
    return kinds


def check_demo(opts: DemoOptions) -> None:
    """ValueError for options the chaos test cannot run, before anything is launched."""
    if opts.nranks < 1 or opts.colls < 1 or opts.iters < 0 or opts.count < 1:
        raise ValueError("--nranks, --colls and --count must be at least 1, --iters at "
                         "least 0")
    unknown = [k for k in opts.kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown collective kind(s) {unknown}")
    if not opts.in_order:
        chaos_orders(opts.colls, opts.nranks, np.random.default_rng(0))   # K >= N


def chaos_worker(comm, opts: DemoOptions) -> dict:
    K, n = opts.colls, comm.nranks
    kinds = [opts.kinds[k % len(opts.kinds)] for k in range(K)]   # collective k's kind
    roots = [k % n for k in range(K)]
    splits = {k: split_matrix(k, opts.count, n) for k in range(K) if kinds[k] == "all_to_allv"}
    sizes = [buffer_elems(kind, opts.count, n) if k not in splits else
             (int(splits[k][comm.rank].sum()), int(splits[k][:, comm.rank].sum()))
             for k, kind in enumerate(kinds)]
    counts = [{} for _ in range(K)]        # an all_to_allv's run gives its counts
    for k, matrix in splits.items():
        counts[k] = dict(send_counts=matrix[comm.rank].tolist(),
                         recv_counts=matrix[:, comm.rank].tolist())
    for k in range(K):
        comm.prepare(k, kinds[k], count=opts.count, dtype=opts.dtype, root=roots[k])
    # in bulk, with the expected outputs, before start() lines the ranks up
    buffers = ChaosBuffers(comm, kinds, sizes, opts.dtype, roots, splits)
    comm.start()
    status = StatusPrinter(comm, opts.status_every) if (opts.status_every
                                                        and comm.rank == 0) else None
    if status is not None:
        status.start()
    rng = np.random.default_rng(opts.seed)       # the same stream on every rank
    bar = None
    if opts.progress and comm.rank == 0:
        from tqdm import tqdm
        what = "all-reduces" if set(kinds) == {"all_reduce"} else "collectives"
        bar = tqdm(total=opts.iters, desc=f"chaos {n} ranks x {K} {what}", unit="it",
                   file=sys.stderr)
    verified, started, in_collectives, filling, checking = 0, time.perf_counter(), [], [], []
    marks = []          # the host's side of the timeline (with --trace)

    def mark(what, coll, it):
        if opts.trace:
            marks.append(host_mark(comm.rank, what, coll, it))

    for it in range(opts.iters):
        orders = ([list(range(K))] * n if opts.in_order else chaos_orders(K, n, rng))
        t0 = time.perf_counter()
        buffers.fill(it)
        sends, recvs = buffers.sends(it), buffers.recvs(it)
        filling.append(time.perf_counter() - t0)
        if opts.align:
            comm.barrier()      # every rank starts submitting at once: no arrival skew
        futures, submitted = [], time.perf_counter()
        mark(MARK_SUBMITTING, None, it)
        for k in orders[comm.rank]:
            futures.append(comm.run(k, sends[k], recvs[k], **counts[k]))
            mark(MARK_RUN, k, it)
            if opts.sync == "device":
                comm.synchronize_device()
        for k, f in zip(orders[comm.rank], futures):
            _wait(comm, f, opts)
            mark(MARK_RESULT, k, it)
        in_collectives.append(time.perf_counter() - submitted)
        t0 = time.perf_counter()
        verified += buffers.check(it, last=it == opts.iters - 1)
        checking.append(time.perf_counter() - t0)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if status is not None:
        status.stop()
    elapsed = time.perf_counter() - started
    out = dict(comm.stats(), verified=verified, seconds=elapsed,
               transports=comm.world.transports(), net=net_stats(comm),
               collective_seconds=in_collectives, trace=None,   # a time per iteration
               fill_seconds=float(np.sum(filling)), check_seconds=float(np.sum(checking)))
    if opts.trace:      # the host marks on the daemon's clock, and how far they moved
        events = comm.trace()
        offset = clock_offset_ns(marks, events)
        out.update(trace=events + on_daemon_clock(marks, offset), clock_offset_ns=offset)
    return out


def _wait(comm, future, opts: DemoOptions) -> None:
    """Wait for one collective (``--status-every``'s lines come from a thread of rank 0)."""
    future.result(timeout=opts.result_timeout)


def traced_worker(comm, opts: DemoOptions) -> dict:
    """``chaos_worker`` for a run that draws its timeline: a deadlock comes back with the
    daemons' events and the wait-for graph, so that the pictures show it too."""
    try:
        return chaos_worker(comm, opts)
    except DeadlockError as exc:
        from .teach_narrate import wait_edges
        return dict(deadlock=exc.report, edges=wait_edges(comm.status(), timeline_names(opts)),
                    trace=comm.trace() + [host_mark(comm.rank, MARK_DEADLOCK)])


def run_demo(opts: DemoOptions, backend: str | None = None, watchdog_timeout=None,
             group=None, **config) -> list[dict] | None:
    """Run the chaos test; returns each rank's stats (raises RankFailedError on failure).
    With ``group`` (``mpiexec`` or ``torchrun`` started a process per rank) this process
    runs its own rank; rank 0 gets every rank's stats, the others None."""
    worker = traced_worker if opts.trace else chaos_worker
    if group is not None:
        return run_in_group(worker, group, args=(opts,), policy=opts.policy,
                            watchdog_timeout=watchdog_timeout, **config)
    return launch(worker, opts.nranks, policy=opts.policy, backend=backend,
                  watchdog_timeout=watchdog_timeout, args=(opts,), **config)


def headline(opts: DemoOptions, overrides: dict, processes: bool) -> str:
    """What the run is, before it starts."""
    return (f"pydfccl chaos demo on the {where()}: {opts.nranks} ranks"
            f"{' (a process each)' if processes else ''}, {opts.colls} collectives "
            f"({', '.join(opts.kinds)}) of {opts.count} x {opts.dtype} per iteration, "
            f"{opts.iters} iterations, policy {policy_label(opts.policy, overrides)}, "
            f"sync {opts.sync}, {'in order' if opts.in_order else '100% disorder'}")


def summarize(opts: DemoOptions, per_rank: list[dict]) -> str:
    iters = opts.iters
    seconds = max(r["seconds"] for r in per_rank)
    # each iteration's time in collectives, the mean over ranks
    each = np.mean([r["collective_seconds"] for r in per_rank], axis=0) if iters else [0.0]
    rows = [f"{'rank':>4} {'verified':>8} {'preempt':>8} {'relaunch':>8} {'steps':>8}"]
    for r in per_rank:
        rows.append(f"{r['rank']:>4} {r['verified']:>8} {r['preemptions']:>8} "
                    f"{r['relaunches']:>8} {r['steps']:>8}")
    total = sum(r["verified"] for r in per_rank)
    fill = np.mean([r["fill_seconds"] for r in per_rank])
    check = np.mean([r["check_seconds"] for r in per_rank])
    rows.append(f"iterations: {iters}; outputs verified: {total} "
                f"({opts.colls} collectives per iteration on {opts.nranks} ranks; a reduce "
                f"only at its root); "
                f"preemptions: {sum(r['preemptions'] for r in per_rank)}; "
                f"relaunches: {sum(r['relaunches'] for r in per_rank)}; "
                f"time per iteration: {1e3 * seconds / max(iters, 1):.2f} ms, of which "
                f"{1e3 * np.mean(each):.2f} ms from a rank's first submission to "
                f"its last completion (mean over ranks; the rest is filling, "
                f"{1e3 * fill / max(iters, 1):.2f} ms, checking, "
                f"{1e3 * check / max(iters, 1):.2f} ms, and waiting for the other ranks' "
                f"host work); "
                f"that time's median iteration {1e3 * np.median(each):.2f} ms, the first "
                f"{1e3 * each[0]:.2f} ms (warm-up: first calls, first launches)"
                + (f"; {transports_line(per_rank)}" if "transports" in per_rank[0] else ""))
    return "\n".join(rows)


def timeline_names(opts: DemoOptions) -> dict:
    return {k: f"{opts.kinds[k % len(opts.kinds)]} {k}" for k in range(opts.colls)}


def write_trace(opts: DemoOptions, events: list, path: str) -> None:
    """The daemons' events and the hosts' marks as a Chrome-trace/Perfetto timeline."""
    with open(path, "w") as f:
        json.dump(to_chrome(events, timeline_names(opts)), f)


def build_parser() -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog="python -m pydfccl demo", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", "--nranks", type=int, default=4 if gpu else 3, help="ranks")
    p.add_argument("-k", "--colls", type=int, default=8, help="collectives per iteration")
    p.add_argument("-i", "--iters", type=int, default=50 if gpu else 5, help="iterations")
    p.add_argument("-c", "--count", type=int, default=4096 if gpu else 100,
                   help="count of each collective (NCCL's meaning)")
    p.add_argument("-d", "--dtype", default="float32", help="element type")
    p.add_argument("--kinds", default="all_reduce",
                   help="comma-separated collective kinds, used in turn, or 'all' "
                        f"({', '.join(KINDS)})")
    add_policy_options(p)
    p.add_argument("--sync", default="none", choices=["none", "device"],
                   help="'device': a device-wide synchronize after every submission")
    p.add_argument("--in-order", action="store_true", help="no disorder (a baseline)")
    p.add_argument("--align", action="store_true",
                   help="a host barrier before each iteration's submissions, so that the time "
                        "in collectives measures scheduling, not ranks arriving apart")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="default: threads on a GPU, processes on the simulator "
                        "(PYDFCCL_BACKEND sets it)")
    p.add_argument("--watchdog", type=float, default=5.0 if gpu else 30.0,
                   help="seconds without progress before a deadlock is reported")
    p.add_argument("--status-every", type=float, default=0.0, metavar="SECONDS",
                   help="while waiting, print every rank's status at this interval")
    p.add_argument("--json", metavar="FILE", help="write the per-rank stats as JSON")
    p.add_argument("--trace", metavar="FILE",
                   help="write the daemons' events, and each rank's host marks (submitting, "
                        "run() returned, result), as a Chrome-trace/Perfetto JSON timeline")
    p.add_argument("--plot", metavar="FILE.png", help="draw the timeline as a picture")
    p.add_argument("--nblocks", type=int, default=None,
                   help="daemon blocks (channels) a rank (default: the machine's, "
                        "pydfccl.host.world.WorldConfig)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--schedule", metavar="FILE", help="replay a model schedule (JSON) instead")
    return p


def _options(args: argparse.Namespace, policy: Policy) -> DemoOptions:
    try:
        kinds = parse_kinds(args.kinds)
    except ValueError as exc:
        raise UsageError(f"--kinds: {exc}") from None
    return DemoOptions(nranks=args.nranks, colls=args.colls, iters=args.iters, count=args.count,
                       dtype=args.dtype, policy=policy, sync=args.sync, seed=args.seed,
                       in_order=args.in_order, align=args.align,
                       progress=not args.no_progress, status_every=args.status_every,
                       kinds=kinds, trace=bool(args.trace or args.plot))


def _replay_schedule(args: argparse.Namespace) -> int:
    """``demo --schedule FILE``: the engine's run of a model schedule beside the model's."""
    policy, _ = chosen_policy(args)       # --param's overrides reach model and daemon
    try:
        schedule = schedule_replay.load_schedule(args.schedule)
        schedule_replay.check_replayable(schedule, args.dtype)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--schedule {args.schedule}: {exc}") from None
    check_backend(args.backend)
    try:
        compared = schedule_replay.replay_against_model(
            schedule, policy, args.dtype, args.backend, watchdog_timeout=args.watchdog)
    except RankFailedError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(schedule_replay.format_comparison(args.schedule, compared, policy, args.dtype))
    return schedule_replay.exit_status(compared)


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.schedule:
        return _replay_schedule(args)
    policy, overrides = chosen_policy(args)
    opts = _options(args, policy)
    group = current_group()    # mpiexec or torchrun started one process per rank: use them
    if group is not None:
        opts = replace(opts, nranks=group.size)
    else:
        check_backend(args.backend)
    sizes = {} if args.nblocks is None else {"nblocks": args.nblocks}
    try:
        check_demo(opts)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    check_world_sizes(opts.nranks, **sizes)
    if group is None or group.rank == 0:
        print(headline(opts, overrides, processes=group is not None), flush=True)
    try:
        per_rank = run_demo(opts, backend=args.backend, watchdog_timeout=args.watchdog,
                            group=group, **sizes)
    except RankFailedError as exc:
        deadlock = "DeadlockError" in str(exc).split("\n", 1)[0]
        text = str(exc).split("\nTraceback", 1)[0] if deadlock else str(exc)
        print(f"\nFAILED: {text}", file=sys.stderr)
        return EXIT_DEADLOCK if deadlock else EXIT_FAILED
    if per_rank is None:      # not rank 0 of a group: rank 0 reports for everyone
        return 0
    events = [e for r in per_rank for e in (r.pop("trace") or [])]
    if any("deadlock" in r for r in per_rank):      # with --trace/--plot: drawn too
        return _deadlock_pictures(opts, args, per_rank, events)
    print(summarize(opts, per_rank))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(options=options_record(opts), ranks=per_rank), f, indent=2)
    if args.trace:
        write_trace(opts, events, args.trace)
        offsets = ", ".join(f"{r['clock_offset_ns'] / 1e3:+.1f}" for r in per_rank)
        print(f"timeline of {len(events)} events written to {args.trace} (each rank's host "
              f"marks moved onto its daemon's clock by {offsets} us)")
    if args.plot:
        draw_timeline(events, args.plot, title=f"chaos demo, {opts.nranks} ranks, "
                      f"{policy_name(opts.policy)}", names=timeline_names(opts))
        print(f"timeline picture written to {args.plot}")
    return 0


def _deadlock_pictures(opts: DemoOptions, args, per_rank: list, events: list) -> int:
    """A deadlocked run with --trace/--plot: the report, then the timeline and the
    wait-for graph (beside the timeline, ``NAME-wait-for.png``)."""
    from ..sched.wait_graph import find_wait_cycle
    report = next(r["deadlock"] for r in per_rank if "deadlock" in r)
    print(f"\nFAILED: DeadlockError: {report}", file=sys.stderr)
    if args.trace:
        write_trace(opts, events, args.trace)
        print(f"timeline of {len(events)} events written to {args.trace}")
    if args.plot:
        title = f"chaos demo, {opts.nranks} ranks, {policy_name(opts.policy)}"
        draw_timeline(events, args.plot, title=title, names=timeline_names(opts),
                      note="deadlock: the watchdog aborted the run")
        edges = next((r["edges"] for r in per_rank if r.get("edges")), [])
        cycle = find_wait_cycle({a: [b for x, b, _ in edges if x == a] for a, _, _ in edges})
        graph = os.path.splitext(args.plot)[0] + "-wait-for.png"
        draw_wait_graph(edges, graph, f"{title}: deadlock", cycle, opts.nranks)
        print(f"timeline picture written to {args.plot}, wait-for graph to {graph}")
    return EXIT_DEADLOCK
