"""The soak: many random schedules run end to end on the engine, every output checked.

Each schedule draws, from a generator seeded by (seed, schedule index), a rank count, a few
collectives (every kind, op and dtype the engine implements; counts of 1, around a slot's
size, and anything up to ``max_count``), how many times each runs, every rank's own
submission order and priorities, and where each rank calls a device-wide synchronize
between its submissions. Every rank checks every output against numpy
(:mod:`pydfccl.protocol.reference`). The summary counts what was verified, wrong and lost, and shows
this process's threads and memory at the start and end, so that a long run shows they stay
flat. ``python -m pydfccl soak`` exits 0 only when nothing was wrong or lost.
"""

from __future__ import annotations

import argparse
import collections
import gc
import itertools
import resource
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .. import platform
from ..protocol.codes import COLLECTIVE_KINDS, DTYPES, OPS, OUT_OF_PLACE_ONLY
from ..errors import RankFailedError
from ..bootstrap.launch import default_backend, launch
from ..protocol.reference import buffer_elems, reference
from ..sched.policies import policy_names
from ..host.world import WorldConfig

__all__ = ["SoakOptions", "Collective", "Schedule", "SoakReport", "draw_schedule",
           "soak_input", "soak_worker", "run_soak", "main"]

ROOTED = ("broadcast", "reduce")
SYNC_CHANCE = 0.25      # of a device-wide synchronize after a submission
REPEAT_CHANCE = 0.3     # of a collective running twice (its runs meet in order across ranks)
MAX_PRIORITY = 3
POISON = 99             # what recv holds before the run: every element must be overwritten
EXIT_OK, EXIT_FAILED = 0, 1


@dataclass(frozen=True)
class SoakOptions:
    schedules: int | None = 10      # None: until ``seconds`` have passed
    seconds: float | None = None    # start no new schedule after this wall time
    seed: int = 0
    max_ranks: int = 3
    max_count: int = 200
    max_colls: int = 4
    policy: str = "dfccl"
    progress: bool = True
    only: int | None = None         # run just this schedule index (to reproduce a failure)
    result_timeout: float = 300.0
    launch_timeout: float = 900.0


@dataclass(frozen=True)
class Collective:
    kind: str
    count: int
    dtype: str
    op: str
    root: int
    runs: int
    in_place: bool

    def describe(self) -> str:
        extras = [f"root {self.root}"] * (self.kind in ROOTED) + ["in place"] * self.in_place
        runs = f" x{self.runs}" if self.runs > 1 else ""
        return f"{self.kind}{runs} ({', '.join([f'{self.count} {self.dtype}', self.op] + extras)})"


@dataclass(frozen=True)
class Schedule:
    """One schedule, as plain data so that it crosses to rank processes. Per rank:
    ``orders`` lists collective ids in submission order (an id once per run),
    ``priorities`` each collective's prepared priority, ``run_priorities`` each
    submission's, ``syncs`` the positions after which the rank synchronizes the device."""

    index: int
    nranks: int
    colls: tuple
    orders: tuple
    priorities: tuple
    run_priorities: tuple
    syncs: tuple

    def describe(self) -> str:
        colls = "; ".join(f"{c}: {coll.describe()}" for c, coll in enumerate(self.colls))
        return (f"schedule {self.index}: {self.nranks} ranks; {colls}; orders "
                f"{[list(o) for o in self.orders]}; syncs after positions "
                f"{[sorted(s) for s in self.syncs]}")


def _draw_count(rng, max_count: int, slot_elems: int) -> int:
    """1, one element either side of a whole number of slots, or anything up to max_count."""
    near_slots = [k * slot_elems + d for k in (1, 2) for d in (-1, 1)
                  if 1 <= k * slot_elems + d <= max_count]
    pick = rng.integers(4)
    if pick == 0:
        return 1
    if pick == 1 and near_slots:
        return int(rng.choice(near_slots))
    return int(rng.integers(1, max_count + 1))


def draw_schedule(seed: int, index: int, opts: SoakOptions, simulator: bool) -> Schedule:
    """Schedule ``index`` of the run seeded ``seed``: the same on every machine and
    independent of the others, so one can be rerun alone (``--only``)."""
    rng = np.random.default_rng([seed, index])
    nranks = int(rng.integers(2, opts.max_ranks + 1))
    slot_bytes = WorldConfig(nranks, simulator=simulator).slot_bytes
    colls = []
    for _ in range(int(rng.integers(1, opts.max_colls + 1))):
        kind, op, dtype = (str(rng.choice(list(t)))
                           for t in (COLLECTIVE_KINDS, OPS, DTYPES))
        colls.append(Collective(
            kind=kind, op=op, dtype=dtype,
            count=_draw_count(rng, opts.max_count, slot_bytes // np.dtype(dtype).itemsize),
            root=int(rng.integers(nranks)) if kind in ROOTED else 0,
            runs=2 if rng.random() < REPEAT_CHANCE else 1,
            in_place=kind not in OUT_OF_PLACE_ONLY and bool(rng.integers(2))))
    runs = [c for c, coll in enumerate(colls) for _ in range(coll.runs)]
    return Schedule(
        index=index, nranks=nranks, colls=tuple(colls),
        orders=tuple(tuple(int(c) for c in rng.permutation(runs)) for _ in range(nranks)),
        priorities=tuple(tuple(int(p) for p in rng.integers(0, MAX_PRIORITY + 1, len(colls)))
                         for _ in range(nranks)),
        run_priorities=tuple(tuple(int(p) for p in rng.integers(0, MAX_PRIORITY + 1, len(runs)))
                             for _ in range(nranks)),
        syncs=tuple(frozenset(int(j) for j in np.flatnonzero(rng.random(len(runs)) < SYNC_CHANCE))
                    for _ in range(nranks)))


def soak_input(rank: int, coll: int, run: int, count: int, dtype: str, op: str,
               nranks: int) -> np.ndarray:
    """Rank ``rank``'s send buffer for one run: small positive integers, so that every op is
    exact in every dtype (a sum of ``nranks`` of them fits in int8; a product is of 1s and
    2s, and wraps in 8-bit integers the same way on the device and in numpy)."""
    span = 2 if op == "prod" else max(1, min(13, 127 // nranks))
    return (((np.arange(count) + 7 * coll + 3 * run + rank) % span) + 1).astype(dtype)


def expected_output(schedule: Schedule, coll: int, run: int, rank: int):
    """numpy's answer for one rank's run (None where NCCL leaves the output unspecified)."""
    spec, n = schedule.colls[coll], schedule.nranks
    send_elems, _ = buffer_elems(spec.kind, spec.count, n)
    inputs = [soak_input(r, coll, run, send_elems, spec.dtype, spec.op, n) for r in range(n)]
    return reference(spec.kind, inputs, spec.op, spec.root, rank)


def soak_worker(comm, schedule: Schedule, result_timeout: float) -> dict:
    """One rank's part of a schedule: prepare, submit in this rank's order with its
    priorities and device syncs, then wait for every run and check its output. It keeps
    every buffer until the end, as a careful user does. Returns plain data."""
    rank, n = comm.rank, comm.nranks
    for c, spec in enumerate(schedule.colls):
        comm.prepare(c, spec.kind, count=spec.count, dtype=spec.dtype, op=spec.op,
                     root=spec.root, priority=schedule.priorities[rank][c])
    comm.start()
    runs_so_far = [0] * len(schedule.colls)
    submitted = []
    for pos, c in enumerate(schedule.orders[rank]):
        spec, run = schedule.colls[c], runs_so_far[c]
        runs_so_far[c] += 1
        send_elems, recv_elems = buffer_elems(spec.kind, spec.count, n)
        send = comm.empty(send_elems, spec.dtype)
        platform.copy_in(send, soak_input(rank, c, run, send_elems, spec.dtype, spec.op, n))
        recv = None
        if not spec.in_place:
            recv = comm.empty(recv_elems, spec.dtype)
            platform.copy_in(recv, np.full(recv_elems, POISON, spec.dtype))
        future = comm.run(c, send, recv, priority=schedule.run_priorities[rank][pos])
        submitted.append((c, run, future, send, recv))
        if pos in schedule.syncs[rank]:
            comm.synchronize_device()
    verified, wrong = 0, []
    for c, run, future, _, _ in submitted:
        got = platform.to_numpy(future.result(timeout=result_timeout), schedule.colls[c].dtype)
        want = expected_output(schedule, c, run, rank)
        if want is None:
            continue            # reduce: only the root's output is defined
        if np.array_equal(got, want):
            verified += 1
            continue
        bad = int(np.flatnonzero(got != want)[0])
        wrong.append(f"schedule {schedule.index}, rank {rank}, collective {c} "
                     f"{schedule.colls[c].describe()}, run {run}: element {bad} is {got[bad]}, "
                     f"expected {want[bad]}")
    return dict(rank=rank, submitted=len(submitted), verified=verified, wrong=wrong,
                stats=comm.stats())


@dataclass
class SoakReport:
    schedules: int = 0
    submitted: int = 0          # runs the workers submitted, all ranks together
    completed: int = 0          # runs the communicators completed
    verified: int = 0
    wrong: list = field(default_factory=list)
    failures: list = field(default_factory=list)    # schedules whose launch failed
    bad_schedules: list = field(default_factory=list)   # indices: failed or a wrong output
    preemptions: int = 0
    relaunches: int = 0
    syncs: int = 0
    dropped_buffers: int = 0
    seconds: float = 0.0
    resources: list = field(default_factory=list)   # ResourceSample, 1, 2, 4, ... schedules in

    @property
    def lost(self) -> int:
        return self.submitted - self.completed

    def verdict(self) -> str | None:
        """Why the run failed, in one line; None when every output verified and no run was
        lost."""
        reasons = []
        if self.failures:
            reasons.append(f"schedule {self.bad_schedules[-1]} failed")
        if self.wrong:
            reasons.append(f"{len(self.wrong)} wrong results")
        if self.lost:
            reasons.append(f"{self.lost} runs lost (submitted but never completed)")
        if not self.schedules and not self.failures:
            reasons.append("no schedule ran")
        return "; ".join(reasons) or None

    def add(self, schedule: Schedule, per_rank: list) -> None:
        self.schedules += 1
        self.syncs += sum(len(s) for s in schedule.syncs)
        if any(out["wrong"] for out in per_rank):
            self.bad_schedules.append(schedule.index)
        for out in per_rank:
            self.submitted += out["submitted"]
            self.verified += out["verified"]
            self.wrong += out["wrong"]
            stats = out["stats"]
            self.completed += stats["completed"]
            self.preemptions += stats["preemptions"]
            self.relaunches += stats["relaunches"]
            self.dropped_buffers += stats["dropped_buffers"]


@dataclass(frozen=True)
class ResourceSample:
    """This process's footprint at one moment: a leak grows these, a cache levels off."""
    when: str
    threads: int
    rss: int                    # resident bytes
    objects: int                # objects Python's garbage collector tracks
    device_used: int | None     # the GPU's memory in use (None under the simulator)
    layouts: int = 0            # entries of Numba's layout cache emptied before this sample
    types: collections.Counter = field(default_factory=collections.Counter, compare=False,
                                       repr=False)   # tracked objects by type name


def resource_sample(when: str) -> ResourceSample:
    """Measure now. RSS is VmRSS where /proc has it, else the peak (``ru_maxrss``, KiB on
    Linux). Numba's layout cache is emptied first (``platform.clear_layout_cache``): it
    grows with every new array size, and the soak's sizes are random, so what still grows
    is pydfccl's. On the H200 it was 15,650 entries of 1,463 schedules (2026-11-29). The
    frees Numba holds back are made, and the garbage collected, first: otherwise the device
    reading swings with the queue of frees (0.8 to 13.3 GiB in the 22:25 soak) and the object
    count with uncollected cycles."""
    layouts = platform.clear_layout_cache()
    platform.flush_frees()
    gc.collect()
    try:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    objects = gc.get_objects()
    types = collections.Counter(_type_name(o) for o in objects)
    return ResourceSample(when, threading.active_count(), rss * 1024, len(objects),
                          platform.device_memory_used(), layouts, types)


def _type_name(obj) -> str:
    """What counts ``obj`` in a sample: its type's name, and for a class the module that
    made it (the GPU soak grew by about one class a schedule, 2026-11-29 21:10)."""
    kind = type(obj)
    if kind is type:
        return f"type ({getattr(obj, '__module__', '?')})"
    return kind.__qualname__


def grown_types(first: ResourceSample, last: ResourceSample, top: int = 6,
                classes: bool = False) -> str:
    """The object types whose count grew most between two samples: where a leak lives.
    With ``classes``, only the classes made, by the module that made them."""
    growth = [(name, n) for name, n in (last.types - first.types).most_common()
              if name not in ("ResourceSample", "Counter")   # the samples themselves
              and (not classes or name.startswith("type ("))][:top]
    return ", ".join(f"{name} +{n}" for name, n in growth) or "none"


def resource_table(samples: list) -> str:
    """One line per sample, aligned."""
    mib = 1 << 20
    lines = [f"  {'when':<24} {'threads':>7} {'RSS MiB':>9} {'objects':>9} {'GPU MiB':>9} "
             f"{'layouts':>8}"]
    for s in samples:
        device = "-" if s.device_used is None else f"{s.device_used / mib:.0f}"
        lines.append(f"  {s.when:<24} {s.threads:>7} {s.rss / mib:>9.1f} {s.objects:>9} "
                     f"{device:>9} {s.layouts:>8}")
    return "\n".join(lines)


def _schedule_indices(opts: SoakOptions):
    if opts.only is not None:
        return [opts.only]
    return itertools.count() if opts.schedules is None else range(opts.schedules)


def run_soak(opts: SoakOptions, backend: str | None = None) -> SoakReport:
    """Run schedules until ``opts.schedules`` are done or ``opts.seconds`` have passed;
    stops at the first schedule whose launch fails (a rank error, a deadlock report)."""
    simulator = (backend or default_backend()) == "processes"
    bar = None
    if opts.progress:
        from tqdm import tqdm
        bar = tqdm(total=1 if opts.only is not None else opts.schedules, desc="soak",
                   unit="schedule", file=sys.stderr)
    report = SoakReport(resources=[resource_sample("at the start")])   # after tqdm's thread
    started = time.perf_counter()
    for index in _schedule_indices(opts):
        if opts.seconds is not None and time.perf_counter() - started >= opts.seconds:
            break
        schedule = draw_schedule(opts.seed, index, opts, simulator)
        try:
            per_rank = launch(soak_worker, schedule.nranks, policy=opts.policy,
                              backend=backend, timeout=opts.launch_timeout,
                              args=(schedule, opts.result_timeout))
        except (RankFailedError, TimeoutError) as exc:
            first = str(exc).split("\nTraceback", 1)[0]
            report.failures.append(f"{schedule.describe()}\n{type(exc).__name__}: {first}")
            report.bad_schedules.append(index)
            break
        report.add(schedule, per_rank)
        n = report.schedules
        if n & (n - 1) == 0:    # after 1, 2, 4, 8, ... schedules: a leak grows, a cache levels
            report.resources.append(resource_sample(f"after {n} schedule{'s' * (n > 1)}"))
        if bar is not None:     # a tqdm without a total (--seconds) has no truth value
            bar.update(1)
            bar.set_postfix(verified=report.verified, wrong=len(report.wrong))
    if bar is not None:
        bar.close()
    report.seconds = time.perf_counter() - started
    report.resources.append(resource_sample("at the end"))
    return report


def summarize(report: SoakReport, opts: SoakOptions, where: str) -> str:
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10
    resources = "resources of this process:\n" + resource_table(report.resources)
    if children:
        resources += f"\n  (largest child process, a rank process: {children / (1 << 20):.1f} MiB)"
    if len(report.resources) > 2:   # from the first schedule's end (imports done) to the end
        first, last = report.resources[1], report.resources[-1]
        per = (last.objects - first.objects) / max(1, report.schedules - 1)
        resources += (f"\n  from the first schedule to the end: threads {first.threads} -> "
                      f"{last.threads}, objects {first.objects} -> {last.objects} ({per:+.2f} "
                      f"a schedule); types grown most: {grown_types(first, last)}; "
                      f"classes made: {grown_types(first, last, 4, classes=True)}")
    return "\n".join([
        f"soak on the {where}: {report.schedules} schedule{'s' * (report.schedules != 1)} "
        f"(seed {opts.seed}, policy {opts.policy}) in {report.seconds:.1f} s",
        f"runs: {report.submitted} submitted on all ranks, {report.completed} completed, "
        f"{report.lost} lost; outputs verified: {report.verified} (a reduce only at its "
        f"root), wrong: {len(report.wrong)}",
        f"preemptions: {report.preemptions}; relaunches: {report.relaunches}; device syncs: "
        f"{report.syncs}; dropped buffers: {report.dropped_buffers}",
        resources,
    ])


def build_parser() -> argparse.ArgumentParser:
    gpu = platform.gpu_available()
    p = argparse.ArgumentParser(prog="python -m pydfccl soak", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-s", "--schedules", type=int, default=None,
                   help=f"schedules to run (if omitted: {200 if gpu else 10}, or no limit "
                        "with --seconds)")
    p.add_argument("--seconds", type=float, default=None,
                   help="start no new schedule after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-ranks", type=int, default=4 if gpu else 3,
                   help="ranks per schedule: 2 up to this")
    p.add_argument("--max-count", type=int, default=100_000 if gpu else 200,
                   help="largest count of a collective (NCCL's meaning)")
    p.add_argument("--max-colls", type=int, default=8 if gpu else 4,
                   help="collectives per schedule: 1 up to this")
    p.add_argument("--policy", default="dfccl", choices=policy_names())
    p.add_argument("--only", type=int, metavar="INDEX",
                   help="run only schedule INDEX of this seed (to reproduce a failure)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _options(args, parser) -> SoakOptions:
    max_colls = WorldConfig(2, simulator=not platform.gpu_available()).max_colls
    checks = [(args.max_ranks >= 2, "--max-ranks must be at least 2"),
              (args.max_count >= 1, "--max-count must be at least 1"),
              (1 <= args.max_colls <= max_colls, f"--max-colls must be in 1..{max_colls}"),
              (args.schedules is None or args.schedules >= 1, "--schedules must be at least 1"),
              (args.only is None or args.only >= 0, "--only must be a schedule index (>= 0)")]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    schedules = args.schedules
    if schedules is None and args.seconds is None:
        schedules = 200 if platform.gpu_available() else 10
    return SoakOptions(schedules=schedules, seconds=args.seconds, seed=args.seed,
                       max_ranks=args.max_ranks, max_count=args.max_count,
                       max_colls=args.max_colls, policy=args.policy,
                       progress=not args.no_progress, only=args.only)


def _extent(opts: SoakOptions) -> str:
    if opts.only is not None:
        return f"schedule {opts.only}"
    limits = []
    if opts.schedules is not None:
        limits.append(f"{opts.schedules} schedules")
    if opts.seconds is not None:
        limits.append(f"{opts.seconds:g} s")
    return " or ".join(limits)


def main(argv: list[str]) -> int:
    parser = build_parser()
    opts = _options(parser.parse_args(argv), parser)
    where = "GPU" if platform.gpu_available() else "CUDA simulator (CPU)"
    print(f"pydfccl soak on the {where}: {_extent(opts)}, 2..{opts.max_ranks} ranks, "
          f"1..{opts.max_colls} collectives of 1..{opts.max_count} elements, seed {opts.seed}, "
          f"policy {opts.policy}", flush=True)
    report = run_soak(opts)
    print(summarize(report, opts, where))
    for line in report.wrong[:10]:
        print(f"wrong: {line}", file=sys.stderr)
    for text in report.failures:
        print(f"failed: {text}", file=sys.stderr)
    verdict = report.verdict()
    if verdict is None:
        print("OK: every output verified, nothing lost")
        return EXIT_OK
    print(f"FAILED: {verdict}", file=sys.stderr)
    for index in report.bad_schedules[:3]:
        print(f"rerun schedule {index} alone: python -m pydfccl soak --seed {opts.seed} "
              f"--max-ranks {opts.max_ranks} --max-count {opts.max_count} --max-colls "
              f"{opts.max_colls} --policy {opts.policy} --only {index}", file=sys.stderr)
    return EXIT_FAILED
