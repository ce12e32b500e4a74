"""Replay a model :class:`~pydfccl.sched.model.Schedule` on the real engine.

A schedule (``pydfccl.sched.model``; JSON via ``Schedule.to_json``) says, per rank, in which
order the host submits each all-reduce and where it calls a device-wide synchronize
(``sync``), waits for everything it submitted so far (``wait_all``) or for one collective
(``wait``). :func:`replay` runs
exactly that on every rank with :func:`pydfccl.launch`, checks every result against numpy,
and reports ``completed`` (with each rank's stats and completion order) or ``deadlock``
(with the watchdog's report). ``python -m pydfccl demo --schedule FILE`` calls
:func:`replay_main`, which also prints what the model predicts for the same schedule.

Inputs are small integers derived from (rank, collective), so every sum is exact in float32
and int64, and the model can be run with the very same values (:func:`model_values`).
"""

from __future__ import annotations

import sys
import time
from typing import Optional, Union

import numpy as np

from ..protocol import layout as L
from .. import platform
from ..errors import RankFailedError
from ..kernels.plans import one_shot_limit
from ..bootstrap.launch import default_backend, launch
from ..protocol.reference import reference
from ..sched.model import Schedule, run_schedule
from ..host.world import WorldConfig

__all__ = ["replay", "replay_worker", "replay_main", "load_schedule", "input_values",
           "expected_values", "model_values", "predict", "completion_order",
           "EXIT_COMPLETED", "EXIT_DEADLOCK"]

EXIT_COMPLETED, EXIT_DEADLOCK = 0, 3
DTYPES = ("float32", "int64")


def input_values(rank: int, coll: int, count: int, dtype="int64") -> np.ndarray:
    """Rank ``rank``'s contribution to collective ``coll``: small integers (1..16)."""
    return (((np.arange(count) + 5 * coll) % 11) + rank + 1).astype(dtype)


def expected_values(nranks: int, coll: int, count: int, dtype="int64") -> np.ndarray:
    return reference("all_reduce", [input_values(r, coll, count, dtype) for r in range(nranks)])


def model_values(schedule: Schedule) -> dict:
    """The same contributions as the engine's, in ``run_schedule(values=...)`` form."""
    return {c: [input_values(r, c, k.count).tolist() for r in range(schedule.nranks)]
            for c, k in schedule.collectives.items()}


def load_schedule(source: Union[str, dict, Schedule]) -> Schedule:
    """A Schedule from itself, its dict form, JSON text or a JSON file path."""
    if isinstance(source, Schedule):
        return source
    if isinstance(source, dict):
        return Schedule.from_dict(source)
    text = source.strip()
    if not text.startswith("{"):
        with open(source) as f:
            text = f.read()
    return Schedule.from_json(text)


def replay_worker(comm, schedule_dict: dict, dtype: str = "float32",
                  result_timeout: float = 600.0) -> dict:
    """One rank's part of a schedule: prepare every collective, run the rank's events in
    order, wait for everything, verify every result. Module-level so rank processes can
    import it; returns plain data."""
    schedule = Schedule.from_dict(schedule_dict)
    colls = sorted(schedule.collectives)
    for c in colls:
        k = schedule.collectives[c]
        comm.prepare(c, "all_reduce", count=k.count, dtype=dtype, priority=k.priority)
    comm.start()
    sends, recvs = {}, {}
    for c in colls:
        count = schedule.collectives[c].count
        sends[c] = comm.empty(count, dtype)
        platform.copy_in(sends[c], input_values(comm.rank, c, count, dtype))
        recvs[c] = comm.empty(count, dtype)

    futures, started = {}, time.perf_counter()
    for ev in schedule.ranks[comm.rank]:
        if ev.op == "submit":
            futures[ev.coll] = comm.run(ev.coll, sends[ev.coll], recvs[ev.coll])
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
        got = platform.to_numpy(recvs[c])
        want = expected_values(comm.nranks, c, schedule.collectives[c].count, dtype)
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
    if any(ev.op == "stream_wait" for program in schedule.ranks for ev in program):
        raise ValueError("the schedule has a stream_wait, which the engine never does: "
                         "pydfccl waits for collectives on the host, never on a CUDA stream "
                         "(docs/design.md, 'Streams'); only the model runs it")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
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
            **config):
    """What the model says for the same schedule, policy, slots and inputs as
    ``replay(schedule, policy, backend, dtype=dtype, **config)`` runs."""
    schedule = load_schedule(schedule)
    simulator = (backend or default_backend()) == "processes"
    cfg = WorldConfig(schedule.nranks, simulator=simulator, **config)
    itemsize = np.dtype(dtype).itemsize
    slot_elems = max(1, cfg.slot_bytes // itemsize)
    one_shot_elems = one_shot_limit(schedule.nranks, cfg.slot_bytes) // itemsize
    return run_schedule(schedule, policy, nslots=cfg.nslots, slot_elems=slot_elems,
                        one_shot_elems=one_shot_elems, values=model_values(schedule))


def replay_main(args) -> int:
    """``python -m pydfccl demo --schedule FILE``: one line for the engine's outcome, one for
    the model's; exit 0 on completion, 3 on deadlock (1: a rank failed otherwise, 2: a bad
    schedule or option)."""
    if args.dtype not in DTYPES:
        print(f"error: --schedule replays {' or '.join(DTYPES)} all-reduces, not {args.dtype}",
              file=sys.stderr)
        return 2
    try:
        schedule = load_schedule(args.schedule)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: cannot read schedule {args.schedule}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    where = "GPU" if platform.gpu_available() else "CUDA simulator"
    model = predict(schedule, args.policy, args.dtype, args.backend)
    started = time.perf_counter()
    try:
        out = replay(schedule, policy=args.policy, backend=args.backend,
                     watchdog_timeout=args.watchdog, dtype=args.dtype)
    except RankFailedError as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    head = (f"schedule {args.schedule} ({schedule.nranks} ranks, {len(schedule.collectives)} "
            f"all-reduces of {args.dtype}, policy {args.policy}) on the {where}:")
    if out["outcome"] == "completed":
        preempt = sum(s["preemptions"] for s in out["stats"])
        relaunch = sum(s["relaunches"] for s in out["stats"])
        print(f"{head} completed in {seconds:.1f} s, {out['verified']} results verified, "
              f"{preempt} preemptions, {relaunch} relaunches; completion order "
              f"{out['completion_order']}")
    else:
        lines = out["report"].splitlines() or ["deadlock"]
        cycle = [line for line in lines if line.startswith("wait-for cycle")]
        print(f"{head} DEADLOCK after {seconds:.1f} s: {'; '.join(lines[:1] + cycle)}")
    print(f"model ({args.policy}): {model.summary()}")
    return EXIT_COMPLETED if out["outcome"] == "completed" else EXIT_DEADLOCK
