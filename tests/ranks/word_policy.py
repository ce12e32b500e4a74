"""A policy whose budgets follow the collective's priority and a word per task that counts
the task's preemptions (``remember``), and a worker that runs it; rank processes import
both by name (the test's folder is on their path)."""

import time

import numpy as np

from pydfccl import platform
from pydfccl.protocol import layout as L
from pydfccl.sched.policies import PREEMPTED, Param, Policy
from shared_workers import fill, rank_inputs


def on_load(params, is_head, try_count, priority, memo):
    """BASE doubled per priority level, STEP more for each preemption of this run."""
    return (params[BASE] << priority) + params[STEP] * memo


def keep(params, threshold, waited, priority):
    return threshold


def once(params, is_head, priority):
    return 1


def submission_order(params, priority, seq, coll):
    return seq          # the ranks disagree on the head: preemptions come


def quit_when_idle(params, idle):
    if idle >= params[QUIT_AFTER]:
        return 1
    return 0


def count_preemptions(params, memo, threshold, waited, priority):
    if waited == PREEMPTED:
        return memo + 1
    return memo


counting = Policy("counting", on_load, keep, once, submission_order, quit_when_idle,
                  count_preemptions,
                  parameters=dict(BASE=Param.time(10_000), STEP=Param.time(5_000),
                                  QUIT_AFTER=Param.time(5_000_000, simulator=50_000_000,
                                                        model=2_000)))


def expected_budget(policy, priority, preempted_before, simulator=False, model=False):
    values = policy.values(simulator=simulator, model=model)
    return (values["BASE"] << priority) + values["STEP"] * preempted_before


def _memo(comm, coll):
    """The policy word of ``coll``'s latest run in block 0's saved context."""
    offset = L.P_TASKS + coll * L.TASK_SIZE
    raw = np.asarray(comm.world.pools[comm.rank].read(offset, L.TASK_SIZE), dtype=np.uint8)
    return int(raw.view(L.TASK)[0]["memo"])


def held_then_opposite(comm, ncolls: int, count: int, hold_s: float):
    """Collective k at priority k; rank 0 submits them all at once, rank 1 after
    ``hold_s`` and in the opposite order, so that rank 0's daemon preempts every one of
    them, pass after pass. The results, the daemon's event log and the policy word each
    run ended with."""
    for k in range(ncolls):
        comm.prepare(k, "all_reduce", count=count, dtype="int64", priority=k)
    comm.start()
    sends = [fill(comm, rank_inputs(comm.rank, count, "int64", k)) for k in range(ncolls)]
    recvs = [comm.empty(count, "int64") for _ in range(ncolls)]
    order = list(range(ncolls))
    if comm.rank == 1:
        time.sleep(hold_s)
        order.reverse()
    futures = {k: comm.run(k, sends[k], recvs[k]) for k in order}
    results = {k: platform.to_numpy(f.result(timeout=120)).tolist() for k, f in futures.items()}
    return dict(results=[results[k] for k in range(ncolls)], trace=comm.trace(),
                lost=comm.trace_lost(), memo=[_memo(comm, k) for k in range(ncolls)],
                simulator=platform.SIMULATOR)
