"""Replay a model :class:`~pydfccl.sched.model.Schedule` on the real engine.

A schedule (``pydfccl.sched.model``; JSON via ``Schedule.to_json``) says, per rank, in which
order the host submits each collective (all-reduces, all_to_allvs) and where it calls a
device-wide synchronize (``sync``), waits for everything it submitted so far (``wait_all``)
or for one collective (``wait``). :func:`replay` runs exactly that on every rank with
:func:`pydfccl.launch`, checks every result against numpy, and reports ``completed`` (with
each rank's stats and completion order) or ``deadlock`` (with the watchdog's report).
``python -m pydfccl demo --schedule FILE`` runs :func:`replay_against_model`: the same,
beside what the model predicts for the schedule.

Inputs are small integers derived from (rank, collective), so every sum is exact in float32
and int64, and the model can be run with the very same values (:func:`model_values`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Optional, Union

import numpy as np

from ..protocol import layout as L
from ..errors import RankFailedError
from ..bootstrap.launch import default_backend, launch
from ..protocol.collectives import split_output
from ..protocol.one_shot import one_shot_limit
from ..protocol.reference import reference
from ..sched.model import Schedule, run_schedule
from ..sched.plugins import spec_of
from ..host.world_config import WorldConfig, on_gpu

__all__ = ["replay", "replay_worker", "load_schedule", "input_values", "expected_values",
           "model_values", "predict", "completion_order", "check_replayable",
           "ReplayComparison", "replay_against_model", "format_comparison", "exit_status",
           "engine_summary", "agree", "EXIT_COMPLETED", "EXIT_DEADLOCK", "EXIT_DISAGREE"]

EXIT_COMPLETED, EXIT_DEADLOCK, EXIT_DISAGREE = 0, 3, 4
DTYPES = ("float32", "int64")


def input_values(rank: int, coll: int, count: int, dtype="int64") -> np.ndarray:
    """Rank ``rank``'s contribution to collective ``coll``: small integers (1..16)."""
    return (((np.arange(count) + 5 * coll) % 11) + rank + 1).astype(dtype)


def expected_values(nranks: int, coll: int, count: int, dtype="int64") -> np.ndarray:
    return reference("all_reduce", [input_values(r, coll, count, dtype) for r in range(nranks)])


def _elems(k, nranks: int, rank: int) -> tuple[int, int]:
    """(send, recv) elements of collective ``k`` (a schedule's) on ``rank``."""
    if k.counts is None:
        return k.count, k.count
    return sum(k.counts[rank]), sum(row[rank] for row in k.counts)


def _expected(k, nranks: int, rank: int, coll: int, dtype) -> np.ndarray:
    if k.counts is None:
        return expected_values(nranks, coll, k.count, dtype)
    inputs = [input_values(r, coll, _elems(k, nranks, r)[0], dtype) for r in range(nranks)]
    return split_output(inputs, k.counts, rank)


def model_values(schedule: Schedule) -> dict:
    """The same contributions as the engine's, in ``run_schedule(values=...)`` form."""
    n = schedule.nranks
    return {c: [input_values(r, c, _elems(k, n, r)[0]).tolist() for r in range(n)]
            for c, k in schedule.collectives.items()}


def load_schedule(source: Union[str, dict, Schedule]) -> Schedule:
    """A Schedule from itself, its dict form, JSON text or a JSON file path; ValueError
    when the text is not a schedule."""
    if isinstance(source, Schedule):
        return source
    if isinstance(source, dict):
        return Schedule.from_dict(source.get("schedule", source))
    text = source.strip()
    if not text.startswith("{"):
        with open(source) as f:          # OSError: no such file, or not readable
            text = f.read()
    try:
        data = json.loads(text)          # a schedule, or a counterexample file's
        return Schedule.from_dict(data.get("schedule", data))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a schedule ({type(exc).__name__}: {exc})") from None


def replay_worker(comm, schedule_dict: dict, dtype: str = "float32",
                  result_timeout: float = 600.0) -> dict:
    """One rank's part of a schedule: prepare every collective, run the rank's events in
    order, wait for everything, verify every result. Module-level so rank processes can
    import it; returns plain data."""
    schedule = Schedule.from_dict(schedule_dict)
    colls = sorted(schedule.collectives)
    n, rank = comm.nranks, comm.rank
    for c in colls:
        k = schedule.collectives[c]
        comm.prepare(c, k.kind, count=k.count, dtype=dtype, priority=k.priority)
    comm.start()
    sends, recvs, counts = {}, {}, {}
    for c in colls:
        k = schedule.collectives[c]
        send_elems, recv_elems = _elems(k, n, rank)
        sends[c] = comm.empty(send_elems, dtype)
        sends[c][...] = input_values(rank, c, send_elems, dtype)
        recvs[c] = comm.empty(recv_elems, dtype)
        counts[c] = ({} if k.counts is None else
                     dict(send_counts=list(k.counts[rank]),
                          recv_counts=[row[rank] for row in k.counts]))

    futures, started = {}, time.perf_counter()
    for ev in schedule.ranks[rank]:
        if ev.op == "submit":
            futures[ev.coll] = comm.run(ev.coll, sends[ev.coll], recvs[ev.coll],
                                        **counts[ev.coll])
        elif ev.op == "sync":
            comm.synchronize_device()
        elif ev.op == "wait":
            futures[ev.coll].result(timeout=result_timeout)
        else:  # wait_all
            for f in list(futures.values()):
                f.result(timeout=result_timeout)
    for f in futures.values():
        f.result(timeout=result_timeout)
    seconds = time.perf_counter() - started
    outputs = {}
    for c in colls:
        got = np.asarray(recvs[c])
        want = _expected(schedule.collectives[c], n, rank, c, dtype)
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            raise AssertionError(f"rank {comm.rank}, collective {c}: element {bad} is "
                                 f"{got[bad]}, expected {want[bad]}")
        outputs[c] = got.astype(np.int64).tolist()
    return dict(rank=comm.rank, verified=len(outputs), outputs=outputs, stats=comm.stats(),
                completion_order=completion_order(comm, colls), seconds=seconds)


def completion_order(comm, coll_ids) -> list:
    """The collective ids in the order this rank completed them, read from its completion
    queue (the last ``CQ_CAP`` of them); ``coll_ids``: every id prepared.

    Done-callbacks cannot tell this exactly: one added after ``run()`` returned runs at once
    if the collective completed in between, out of turn.
    """
    cq = comm.world.ctl["cq"][comm.rank]
    ids = sorted(coll_ids)          # the daemon's collective index is the sorted position
    n = comm.stats()["completed"]
    return [ids[int(cq["coll"][k % L.CQ_CAP])] for k in range(max(0, n - L.CQ_CAP), n)
            if cq["stamp"][k % L.CQ_CAP] == k + 1]


def _report_text(exc: RankFailedError) -> str:
    """The DeadlockError's report from a rank failure (without the traceback)."""
    text = str(exc).split("\nTraceback (most recent call last)")[0]
    return text.split("DeadlockError: ", 1)[-1].strip()


def replay(schedule, policy="dfccl", backend: Optional[str] = None,
           watchdog_timeout: Optional[float] = None, dtype: str = "float32",
           timeout: Optional[float] = None, **config) -> dict:
    """Run ``schedule`` on the engine; returns an outcome dict.

    ``{"outcome": "completed", "ranks": [per-rank dict], "completion_order": [[coll, ...]
    per rank], "verified": total, "stats": [per-rank stats]}`` or ``{"outcome": "deadlock",
    "report": text}`` when a rank failed with a deadlock report. Any other failure raises
    (a wrong result is an AssertionError inside a :class:`RankFailedError`). ``timeout``
    bounds the whole launch (``TimeoutError``); ``config`` overrides WorldConfig sizes.
    """
    schedule = load_schedule(schedule)
    check_replayable(schedule, dtype)
    try:
        ranks = launch(replay_worker, schedule.nranks, policy=policy, backend=backend,
                       timeout=timeout, watchdog_timeout=watchdog_timeout,
                       args=(schedule.to_dict(), dtype), **config)
    except RankFailedError as exc:
        if "deadlock" not in str(exc):
            raise
        return dict(outcome="deadlock", report=_report_text(exc), rank=exc.rank)
    return dict(outcome="completed", ranks=ranks,
                completion_order=[r["completion_order"] for r in ranks],
                verified=sum(r["verified"] for r in ranks),
                stats=[r["stats"] for r in ranks])


def predict(schedule, policy="dfccl", dtype: str = "float32", backend: Optional[str] = None,
            options: Optional[dict] = None, **config):
    """What the model says for the same schedule, policy, slots and inputs as
    ``replay(schedule, policy, backend, dtype=dtype, **config)`` runs; ``options`` adds
    ``run_schedule``'s tick options (seed, start_ticks, relaunch_ticks, max_quiet_ticks)."""
    schedule = load_schedule(schedule)
    simulator = (backend or default_backend()) == "processes"
    cfg = WorldConfig(schedule.nranks, simulator=simulator, **config)
    itemsize = np.dtype(dtype).itemsize
    slot_elems = max(1, cfg.slot_bytes // itemsize)
    one_shot_elems = one_shot_limit(schedule.nranks, cfg.slot_bytes) // itemsize
    ticks = {k: v for k, v in (options or {}).items()
             if k in ("seed", "start_ticks", "relaunch_ticks", "max_quiet_ticks")}
    return run_schedule(schedule, policy, nslots=cfg.nslots, slot_elems=slot_elems,
                        one_shot_elems=one_shot_elems, values=model_values(schedule), **ticks)


@dataclass(frozen=True)
class ReplayComparison:
    """A schedule run on the engine beside what the model predicts for it."""

    schedule: Schedule
    outcome: dict           # replay()'s: completed (with stats) or deadlock (with a report)
    model: object           # predict()'s pydfccl.sched.model.Result
    seconds: float          # the engine's wall time


def check_replayable(schedule: Schedule, dtype: str) -> None:
    """ValueError when the engine cannot run ``schedule`` in ``dtype`` (before launching)."""
    if any(ev.op == "stream_wait" for program in schedule.ranks for ev in program):
        raise ValueError("the schedule has a stream_wait, which the engine never does: "
                         "pydfccl waits for collectives on the host, never on a CUDA stream "
                         "(docs/design.md, 'Streams'); only the model runs it")
    if dtype not in DTYPES:
        raise ValueError(f"a replay runs collectives of {' or '.join(DTYPES)}, not {dtype}")


def replay_against_model(schedule, policy="dfccl", dtype: str = "float32",
                         backend: Optional[str] = None,
                         watchdog_timeout: Optional[float] = None,
                         options: Optional[dict] = None) -> ReplayComparison:
    """The model's prediction for ``schedule`` (with ``options``' tick options), then the
    engine's run of it (see :func:`predict` and :func:`replay`; a failure other than a
    deadlock raises)."""
    schedule = load_schedule(schedule)
    model = predict(schedule, policy, dtype, backend, options)
    started = time.perf_counter()
    outcome = replay(schedule, policy=policy, backend=backend,
                     watchdog_timeout=watchdog_timeout, dtype=dtype)
    return ReplayComparison(schedule, outcome, model, time.perf_counter() - started)


def engine_summary(compared: ReplayComparison) -> str:
    """The engine's verdict in a line: completed with its counts, or the deadlock report's
    first line and wait-for cycle."""
    out = compared.outcome
    if out["outcome"] == "completed":
        preempt = sum(s["preemptions"] for s in out["stats"])
        relaunch = sum(s["relaunches"] for s in out["stats"])
        return (f"completed in {compared.seconds:.1f} s, {out['verified']} results "
                f"verified, {preempt} preemptions, {relaunch} relaunches; completion order "
                f"{out['completion_order']}")
    lines = out["report"].splitlines() or ["deadlock"]
    cycle = [line for line in lines if line.startswith("wait-for cycle")]
    return f"DEADLOCK after {compared.seconds:.1f} s: {'; '.join(lines[:1] + cycle)}"


def agree(compared: ReplayComparison) -> bool:
    """Whether the model's verdict is the engine's (completed, or deadlock)."""
    return compared.model.outcome == compared.outcome["outcome"]


def format_comparison(name: str, compared: ReplayComparison, policy, dtype: str) -> str:
    """One line for the engine's outcome, one for the model's, and a third when they
    disagree."""
    schedule = compared.schedule
    where = "GPU" if on_gpu() else "CUDA simulator"
    policy = policy if isinstance(policy, str) else spec_of(policy)
    kinds = sorted({k.kind for k in schedule.collectives.values()})
    what = "all-reduces" if kinds == ["all_reduce"] else f"collectives ({', '.join(kinds)})"
    head = (f"schedule {name} ({schedule.nranks} ranks, {len(schedule.collectives)} {what} "
            f"of {dtype}, policy {policy}) on the {where}:")
    text = f"{head} {engine_summary(compared)}\nmodel ({policy}): {compared.model.summary()}"
    if not agree(compared):
        text += (f"\nthe model and the engine DISAGREE: model {compared.model.outcome}, "
                 f"engine {compared.outcome['outcome']}")
    return text


def exit_status(compared: ReplayComparison) -> int:
    """0 when both completed, EXIT_DEADLOCK when both deadlocked, EXIT_DISAGREE when the
    model and the engine disagree."""
    if not agree(compared):
        return EXIT_DISAGREE
    return EXIT_COMPLETED if compared.outcome["outcome"] == "completed" else EXIT_DEADLOCK
