"""The soak's running: each schedule launched on its ranks, every rank submitting in its
own order with its priorities and device syncs, then checking every output against numpy
(``pydfccl.protocol.reference``)."""

from __future__ import annotations

import itertools
import sys
import time

import numpy as np

from ..bootstrap.launch import default_backend, launch
from ..errors import RankFailedError
from ..protocol.reference import buffer_elems
from .soak_report import SoakReport
from .soak_resources import resource_sample
from .soak_schedules import Schedule, SoakOptions, draw_schedule, expected_output, soak_input

__all__ = ["soak_worker", "run_soak"]

POISON = 99             # what recv holds before the run: every element must be overwritten


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
        send[...] = soak_input(rank, c, run, send_elems, spec.dtype, spec.op, n)
        recv = None
        if not spec.in_place:
            recv = comm.empty(recv_elems, spec.dtype)
            recv[...] = POISON
        future = comm.run(c, send, recv, priority=schedule.run_priorities[rank][pos])
        submitted.append((c, run, future, send, recv))
        if pos in schedule.syncs[rank]:
            comm.synchronize_device()
    verified, wrong = 0, []
    for c, run, future, _, _ in submitted:
        got = np.asarray(future.result(timeout=result_timeout))
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
