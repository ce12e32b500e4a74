"""``python -m pydfccl teach``: a deadlock a student can watch, and how dfccl prevents it.

One small program on 2 or 3 ranks: each iteration every rank submits the same all-reduces
and calls a device-wide synchronize after each submission; iteration 0 in the same order
on every rank, the later ones in a different order on every rank. It runs twice:

1. as NCCL runs it (the launch-per-collective baseline: a kernel per collective that spins
   until its peers arrive): iteration 0 completes, iteration 1 deadlocks, and the watchdog
   reports the wait-for cycle;
2. under ``dfccl`` (one daemon per rank that preempts a collective whose wait runs past its
   budget, resumes it later, and quits so that the syncs return): every iteration completes.

Each rank's submission order is printed first, then what each daemon does as it happens,
the wait-for graph when it changes, and the pictures (``pydfccl.cli.pictures``) are written
to ``--out``. The exit status is 0 when the lessons ran as they should (the baseline
deadlocked where the orders differ, dfccl completed with every result right).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import numpy as np

from ..bootstrap.launch import BACKENDS, launch
from ..errors import DeadlockError, RankFailedError
from ..host.trace import (MARK_RESULT, MARK_RUN, MARK_SUBMITTING, clock_offset_ns,
                          host_mark, on_daemon_clock)
from ..sched.wait_graph import find_wait_cycle
from .exits import UsageError
from .options import check_backend, where
from .pictures import MARK_DEADLOCK, MARK_SYNCED, draw_timeline, draw_wait_graph
from .teach_narrate import Narrator, format_graph, wait_edges

__all__ = ["Lesson", "LessonResult", "submission_orders", "names_of", "teach_worker", "run_lesson",
           "teach", "build_parser", "main"]

EXIT_UNEXPECTED = 1


@dataclass(frozen=True)
class Lesson:
    """One run of the program: ``baseline`` (a kernel launch per collective) or dfccl."""
    title: str
    nranks: int
    iters: int
    baseline: bool
    count: int = 64
    watchdog: float = 3.0
    result_timeout: float = 120.0


@dataclass
class LessonResult:
    lesson: Lesson
    per_rank: list              # each rank's worker result
    deadlock: str | None        # the watchdog's report, once
    edges: list                 # the wait-for graph to draw: (rank, peer, label)
    cycle: list | None

    @property
    def events(self) -> list:
        return [e for r in self.per_rank for e in r["events"]]

    @property
    def completed_iters(self) -> int:
        return min(r["completed_iters"] for r in self.per_rank)

    @property
    def preemptions(self) -> int:
        return sum(r["stats"]["preemptions"] for r in self.per_rank)

    @property
    def relaunches(self) -> int:
        return sum(r["stats"]["relaunches"] for r in self.per_rank)


def submission_orders(nranks: int, it: int) -> list[list[int]]:
    """Each rank's order of the collectives 0..nranks-1 in iteration ``it``: the same on
    every rank in iteration 0, then rank r starts at collective r (no two ranks submit the
    same collective at the same position)."""
    base = list(range(nranks))
    if it == 0:
        return [base] * nranks
    return [base[r:] + base[:r] for r in range(nranks)]


def names_of(nranks: int) -> dict:
    return {k: f"all_reduce {k}" for k in range(nranks)}


def _expected(nranks: int, coll: int, it: int) -> float:
    return float(sum(r + 1 + coll + it for r in range(nranks)))


def teach_worker(comm, lesson: Lesson) -> dict:
    """The program, narrated. A deadlock is caught here, so that the events and the
    wait-for graph come back for the pictures."""
    n, names = comm.nranks, names_of(comm.nranks)
    log = logging.getLogger("pydfccl")
    level = log.level
    if lesson.baseline:     # the deadlock is the lesson: reported once, by the teacher
        log.setLevel(logging.ERROR)
    for k in range(n):
        comm.prepare(k, "all_reduce", count=lesson.count, dtype="float32")
    comm.start()
    bufs = [comm.empty(lesson.count, "float32") for _ in range(n)]
    comm.barrier()          # the narration's zero: every rank's program starts now
    narrator = Narrator(comm, names, time.time(), lead=comm.rank == 0,
                        watchdog=lesson.watchdog, baseline=lesson.baseline)
    marks, done, report, edges = [], 0, None, []

    def mark(what, coll, it):
        marks.append(host_mark(comm.rank, what, coll, it))

    narrator.start()
    it = 0
    try:
        for it in range(lesson.iters):
            order = submission_orders(n, it)[comm.rank]
            for k in range(n):
                bufs[k][...] = comm.rank + 1 + k + it
            mark(MARK_SUBMITTING, None, it)
            futures = {}
            for k in order:
                narrator.say(f"rank {comm.rank} host: run({names[k]}), then a device sync"
                             + (f" (iteration {it})" if k == order[0] else ""))
                futures[k] = comm.run(k, bufs[k])
                mark(MARK_RUN, k, it)
                comm.synchronize_device()
                mark(MARK_SYNCED, k, it)
                narrator.say(f"rank {comm.rank} host: device sync returned")
            for k in order:
                out = np.asarray(futures[k].result(timeout=lesson.result_timeout))
                mark(MARK_RESULT, k, it)
                if not np.all(out == _expected(n, k, it)):
                    raise AssertionError(f"iteration {it}, {names[k]}: got {out[0]}, "
                                         f"expected {_expected(n, k, it)}")
            done += 1
    except DeadlockError as exc:
        report = exc.report
        edges = wait_edges(comm.status(), names)
        mark(MARK_DEADLOCK, None, it)
    except FutureTimeout:
        report = f"no result within {lesson.result_timeout} s"
    finally:
        narrator.stop()
        log.setLevel(level)
    events = comm.trace()
    offset = clock_offset_ns(marks, events)
    graphs = narrator.graphs if comm.rank == 0 else []
    return dict(rank=comm.rank, completed_iters=done, report=report, edges=edges,
                graphs=graphs, stats=comm.stats(),
                events=events + on_daemon_clock(marks, offset))


def run_lesson(lesson: Lesson, backend: str | None = None) -> LessonResult:
    """Launch the program for ``lesson``; every rank's result, the report once, and the
    wait-for graph to draw (the deadlock's, else the graph with a cycle seen on the way)."""
    per_rank = launch(teach_worker, lesson.nranks, policy="dfccl", backend=backend,
                      watchdog_timeout=lesson.watchdog, persistent=not lesson.baseline,
                      args=(lesson,))
    report = next((r["report"] for r in per_rank if r["report"]), None)
    edges = next((r["edges"] for r in per_rank if r["edges"]), [])
    if not edges:       # no deadlock: the most telling graph seen, a cycle if there was one
        graphs = per_rank[0]["graphs"]
        edges = next((g for g in graphs if _cycle(g)), max(graphs, key=len, default=[]))
    return LessonResult(lesson, per_rank, report, edges, _cycle(edges))


def _cycle(edges: list) -> list | None:
    return find_wait_cycle({a: [b for x, b, _ in edges if x == a] for a, _, _ in edges})


def _print_program(nranks: int, iters: int, count: int) -> None:
    names = names_of(nranks)
    print(f"The program: {nranks} ranks, {nranks} all-reduces of {count} float32 each, "
          f"{iters} iterations. Each rank submits them in this order, and after each "
          "submission its host calls a device-wide synchronize (as cudaDeviceSynchronize, "
          ".item() or a blocking copy would):")
    for it in range(iters):
        orders = submission_orders(nranks, it)
        same = all(o == orders[0] for o in orders)
        for r, order in enumerate(orders):
            print(f"  iteration {it}, rank {r}: " + ", ".join(names[k] for k in order)
                  + ("   (the same order on every rank)" if same and r == 0 else ""))
    print()


def _pictures(result: LessonResult, out: str, tag: str) -> list[str]:
    """The lesson's wait-for graph and timeline, written to ``out``; their paths."""
    os.makedirs(out, exist_ok=True)
    lesson, names = result.lesson, names_of(result.lesson.nranks)
    graph = os.path.join(out, f"{tag}-wait-for.png")
    timeline = os.path.join(out, f"{tag}-timeline.png")
    if result.deadlock:
        note = None
        title = f"{lesson.title}: deadlock"
    else:
        title = f"{lesson.title}: the waits seen on the way"
        note = ("red: a wait-for cycle, broken by a preemption (no deadlock)" if result.cycle
                else None)
    draw_wait_graph(result.edges, graph, title, result.cycle, lesson.nranks, note=note)
    what = (f"deadlocked in iteration {result.completed_iters}: the watchdog aborted it"
            if result.deadlock else
            f"all {lesson.iters} iterations completed, {result.preemptions} preemptions, "
            f"{result.relaunches} relaunches")
    draw_timeline(result.events, timeline, lesson.title, names, note=what)
    return [graph, timeline]


def teach(nranks: int = 2, iters: int = 2, out: str = "teach-pictures", watchdog: float = 3.0,
          backend: str | None = None, pictures: bool = True) -> int:
    """Run the lessons, narrated; write the pictures to ``out``. Exit status: 0 when the
    baseline deadlocked where the orders differ and dfccl completed every iteration."""
    print(f"pydfccl teach on the {where()}\n")
    _print_program(nranks, iters, 64)
    lessons = [
        ("baseline", Lesson("NCCL-style: a kernel launch per collective", nranks, iters,
                            baseline=True, watchdog=watchdog)),
        ("dfccl", Lesson("dfccl: one preemptible daemon per rank", nranks, iters,
                         baseline=False, watchdog=max(watchdog, 30.0))),
    ]
    results = {}
    for tag, lesson in lessons:
        print(f"== {lesson.title} ==")
        result = results[tag] = run_lesson(lesson, backend)
        if result.deadlock:
            print(f"\nDEADLOCK, as the watchdog reports it:\n{result.deadlock}")
        else:
            print(f"\ncompleted: {result.completed_iters} iterations, every result checked; "
                  f"{result.preemptions} preemptions, {result.relaunches} relaunches")
        if result.edges:
            print(format_graph(result.edges))
        if pictures:
            paths = _pictures(result, out, tag)
            print("pictures: " + ", ".join(paths))
        print()
    base, ours = results["baseline"], results["dfccl"]
    checks = [
        (base.completed_iters == 1, "the baseline completed the iteration in order"),
        (bool(base.deadlock) and base.cycle is not None,
         "the baseline deadlocked where the orders differ, in a wait-for cycle"),
        (ours.deadlock is None and ours.completed_iters == iters,
         "dfccl completed every iteration"),
        (ours.preemptions > 0, "dfccl preempted a collective to get there"),
    ]
    print("What happened:")
    for ok, text in checks:
        print(f"  [{'x' if ok else ' '}] {text}")
    print("Why: under the baseline each rank's GPU runs its collectives one kernel at a time, "
          "each spinning until its peers arrive, so two ranks in different collectives wait "
          "for each other forever, and a device sync waits behind them. dfccl's daemon gives "
          "up a wait that runs past its budget (a preemption), saves where it stopped, runs "
          "the collective the peer is on, resumes the first later, and quits when stuck so "
          "that the device syncs return.")
    return 0 if all(ok for ok, _ in checks) else EXIT_UNEXPECTED


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl teach",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", "--nranks", type=int, default=2, choices=[2, 3], help="ranks")
    p.add_argument("-i", "--iters", type=int, default=2,
                   help="iterations (the first in order, the others disordered); at least 2")
    p.add_argument("--out", default="teach-pictures", metavar="DIR",
                   help="directory for the pictures")
    p.add_argument("--no-pictures", action="store_true", help="do not draw")
    p.add_argument("--watchdog", type=float, default=3.0,
                   help="seconds without progress before the baseline's deadlock is reported")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="default: threads on a GPU, processes on the simulator")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.iters < 2:
        raise UsageError("--iters must be at least 2 (the first in order, then disorder)")
    if args.watchdog <= 0:
        raise UsageError("--watchdog must be positive")
    check_backend(args.backend)
    if not args.no_pictures:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("the pictures need matplotlib (pip install 'pydfccl[plot]'), "
                             "or pass --no-pictures") from None
    try:
        return teach(args.nranks, args.iters, args.out, args.watchdog, args.backend,
                     pictures=not args.no_pictures)
    except RankFailedError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return EXIT_UNEXPECTED
