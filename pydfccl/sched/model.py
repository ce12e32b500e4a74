"""A pure, deterministic model of N ranks' daemons running all-reduces (ring or one-shot).

The model runs the daemon's scheduler (``schedule()`` in ``pydfccl/kernels/daemon.py``, one
block per rank) with the same policy functions (:mod:`pydfccl.sched.policies`), so that a
schedule that deadlocks, livelocks or completes here does so on the GPU too, up to timing. It
is for tests: Hypothesis explores invocation orders, syncs, priorities, sizes and
interleavings, thousands of small schedules a second, and a failing one prints as JSON that
``python -m pydfccl demo --schedule FILE`` replays.

Time is in ticks. In each tick every rank takes one turn, in round-robin order or in an order
shuffled by a seed: a relaunch of its daemon if one is due, one host event, then one daemon
action (one check of a step's conditions, or one poll of an empty queue). A step waits until
all its conditions hold, then does everything at once, so a preempted collective leaves no
partial state and its context is the step index. Stretches where every daemon only spins on
a step that cannot become ready (or polls an empty queue) are skipped in one go, which is
what makes GPU-sized spin budgets cheap.

What the host does, as ``pydfccl.host.communicator`` does it:

- ``submit`` appends to the daemon's queue and launches the daemon if it is not running.
- ``sync`` (a device-wide synchronize) returns once the daemon is not running: it quit, or
  never started. A policy that never quits (``nccl``) therefore never lets a sync return
  once its daemon runs; ``launch_per_call`` quits whenever its queue is empty, as NCCL's
  per-collective kernels end.
- ``wait_all`` waits until every collective the rank submitted has completed there, and
  ``wait`` (with ``coll``) until that one has: a host that waits for a result, which is
  how ``pydfccl.torch`` waits, on CUDA tensors too.
- A daemon that quits with work outstanding is relaunched at once if that launch made
  progress, else ``relaunch_ticks`` later or at the rank's next submission.

And what pydfccl does *not* do, so that tests can show why: ``stream_wait`` (with
``coll``) makes the rank's *stream* wait on the GPU for ``coll`` while the host goes on
(``cuStreamWaitValue``, what CUDA stream ordering of a collective would be). Work behind
it on the stream waits too: a later ``submit`` enters the daemon's queue only once the
stream has passed every earlier ``stream_wait`` (the stream gate: a run starts when its
stream has made its inputs), and a ``sync`` waits for the stream as well as the daemon.
While a host sits in such a ``sync``, the rank's daemon cannot be launched: a device-wide
wait holds up the process's launches (seen on an H200 under MPS; CUDA documents that
ordering made with stream waits is invisible to its scheduler). No daemon quit can end a
stream wait, so schedules that complete with ``wait`` can deadlock with ``stream_wait``
(``tests/unit/test_model.py``).

Each slot carries at most ``slot_elems`` elements; a collective of ``count`` elements needs
``ceil(count / (nranks * slot_elems))`` loops of ``2 * nranks - 1`` steps in the ring. A
collective of at most ``one_shot_elems`` elements runs one-shot, as the daemon runs a small
all_reduce (``kernels/plans.py``): a ``sendAll`` step that needs a free slot in every
peer's lane and writes its input there, then a ``recvReduceCopyAll`` that waits for every
peer's input and sums all of them in rank order. ``run_schedule`` takes ``one_shot_elems``
(default 0: the ring always); ``replay.predict`` passes the engine's limit.

This module is the model's front: :func:`run_schedule` and every public name. The pieces
live beside it: :mod:`~pydfccl.sched.schedule` (schedules, results, JSON),
:mod:`~pydfccl.sched.steps` (the collectives' steps), :mod:`~pydfccl.sched.simulation` (the
ticks), :mod:`~pydfccl.sched.quiet` (when no progress means a livelock) and
:mod:`~pydfccl.sched.wait_graph` (wait-for cycles).
"""


from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

from .policies import Policy, get_policy
from .schedule import (COMPLETED, DEADLOCK, LIVELOCK, SYNC, WAIT_ALL, Collective, Event,
                       Result, Schedule, stream_wait, submit, wait)
from .simulation import Simulation
from .steps import ring_steps
from .wait_graph import find_wait_cycle

__all__ = [
    "COMPLETED",
    "DEADLOCK",
    "LIVELOCK",
    "Collective",
    "Event",
    "submit",
    "wait",
    "stream_wait",
    "SYNC",
    "WAIT_ALL",
    "Schedule",
    "Result",
    "ring_steps",
    "run_schedule",
    "find_wait_cycle",
]


def run_schedule(schedule: Schedule, policy: Union[str, Policy] = "dfccl", params=None, *,
                 nslots: int = 4, slot_elems: int = 1, one_shot_elems: int = 0,
                 relaunch_ticks: int = 1,
                 seed: Optional[int] = None, start_ticks: Optional[Sequence[int]] = None,
                 max_quiet_ticks: Optional[int] = None,
                 values: Optional[Mapping[int, Sequence[Sequence[int]]]] = None) -> Result:
    """Run ``schedule`` under ``policy`` and report completion, deadlock or livelock.

    ``params`` defaults to ``policy.param_array(model=True)`` (budgets in ticks).
    Collectives of at most ``one_shot_elems`` elements run one-shot (module docstring).
    ``relaunch_ticks`` is the host's pause before relaunching a daemon that quit without
    progress. ``seed`` shuffles the ranks' order within each tick (None: round-robin);
    ``start_ticks`` delays each rank's host. ``values[c][r]`` is rank r's contribution to
    collective c (default: small distinct integers). Deterministic: the same arguments give
    the same Result.
    """
    policy = get_policy(policy)
    if params is None:
        params = policy.param_array(model=True)
    if nslots < 2:
        # every rank would hold a full outgoing slot and need a free one to consume its input
        raise ValueError(f"a ring with atomic recv+send steps needs nslots >= 2, got {nslots}")
    if slot_elems < 1 or relaunch_ticks < 1:
        raise ValueError("slot_elems and relaunch_ticks must be >= 1")
    if start_ticks is not None and len(start_ticks) != schedule.nranks:
        raise ValueError(f"start_ticks needs {schedule.nranks} entries")
    model = Simulation(schedule, policy, params, nslots, slot_elems, one_shot_elems,
                       relaunch_ticks, seed, start_ticks, max_quiet_ticks, values)
    return model.run()
