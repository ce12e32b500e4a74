"""Priorities: a late high-priority collective overtakes low-priority ones queued before it.

Two ranks, collectives LOWS (priority 0), HIGH, and two hand-offs GO and THEN::

    rank 0: run LOWS, run HIGH, [sample its daemon's head], run GO, wait HIGH, run THEN, wait
    rank 1: run GO, wait; run HIGH, wait; run THEN, wait; run LOWS, wait

Rank 1 submits the lows only after THEN, which rank 0 submits only after HIGH completed on
rank 0. So on rank 0 HIGH must complete before every low although it was queued behind
them: the daemon has to run it past four stuck collectives. That order is forced by the data
dependencies, not by timing; it is read from each rank's completion queue and, on rank 0,
from done-callbacks added before anything could complete. Under nccl (submission order,
no preemption) the same program deadlocks.

What the priority itself decides is which task the daemon tries first and longest (the head
of its sorted list). While everything on rank 0 is stuck, a sampler reads the task its
daemon has loaded: with HIGH at priority 1 (``prepare``) or 5 (``run(..., priority=5)``) the
head is HIGH, without priorities it is the lowest id. The head is tried ``NUM_TRY`` times a
pass with growing budgets, the others once: on the simulator it shows in about 60% of the
samples, no other task in more than 20% (the last one of a pass also shows while the daemon
is quit between launches), and the test asks for twice any other. The priority each run
carried to the device is read back from the daemon's saved task records (all backends).
"""

import collections
import threading
import time

import numpy as np
import pytest

import pydfccl
from pydfccl.protocol import layout as L
from pydfccl import platform
from pydfccl.cli.replay import completion_order

LOWS, HIGH, GO, THEN = [0, 1, 2, 3], 9, 10, 11
IDS = sorted(LOWS + [HIGH, GO, THEN])   # the daemon's collective index is the sorted position
COUNT = 12
SAMPLE_S = 0.8


def _inputs(rank, coll):
    return (np.arange(COUNT) + 3 * coll) % 7 + rank + 1


def _expected(nranks, coll):
    return sum(_inputs(r, coll) for r in range(nranks)).tolist()


def _device_priority(comm, coll):
    """The priority the daemon recorded for ``coll``'s latest run (block 0's task record)."""
    offset = L.P_TASKS + IDS.index(coll) * L.TASK_SIZE
    raw = np.asarray(comm.world.pools[comm.rank].read(offset, L.TASK_SIZE), dtype=np.uint8)
    return int(raw.view(L.TASK)[0]["priority"])


def _sample_heads(comm, seconds):
    """How often each collective was the one rank ``comm.rank``'s daemon had loaded."""
    blocks = comm.world.ctl["blocks"][comm.rank]
    seen = collections.Counter()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        index = int(blocks["coll"][0]) - 1
        if index >= 0:
            seen[IDS[index]] += 1
        time.sleep(0.002)
    return dict(seen)


def overtake_worker(comm, how, sample_s):
    """``how``: "prepare" (HIGH prepared with priority 1), "override" (prepared with 0, run
    with priority=5) or "none" (no priorities)."""
    for c in IDS:
        comm.prepare(c, "all_reduce", count=COUNT, dtype="int64",
                     priority=1 if (c == HIGH and how == "prepare") else 0)
    comm.start()
    bufs = {}
    for c in IDS:
        send = comm.empty(COUNT, "int64")
        send[...] = _inputs(comm.rank, c)
        bufs[c] = (send, comm.empty(COUNT, "int64"))
    seen, lock, futures = [], threading.Lock(), {}

    def run(c, **kw):
        futures[c] = comm.run(c, *bufs[c], **kw)
        return futures[c]

    def watch(c):
        """Record c's completion from a done-callback. Only race-free for a future that
        cannot complete before the callback is added (else it runs at once, out of turn)."""
        def done(f):
            if f.exception() is None:
                with lock:
                    seen.append(c)
        futures[c].add_done_callback(done)

    high = dict(priority=5) if how == "override" else {}
    heads = {}
    if comm.rank == 0:
        for c in LOWS:
            run(c)
        run(HIGH, **high)
        for c in LOWS + [HIGH]:   # nothing of these can complete before rank 0 submits GO
            watch(c)
        heads = _sample_heads(comm, sample_s)   # nothing can move: rank 1 waits for GO
        run(GO)
        futures[HIGH].result(timeout=120)
        run(THEN)
    else:
        run(GO).result(timeout=120)
        run(HIGH, **high).result(timeout=120)
        run(THEN).result(timeout=120)
        for c in LOWS:
            run(c)
    for f in futures.values():
        f.result(timeout=120)
    deadline = time.monotonic() + 10   # callbacks run just after result() returns
    while comm.rank == 0 and len(seen) < len(LOWS) + 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    results = {c: platform.to_numpy(bufs[c][1]).tolist() for c in IDS}
    return dict(order=completion_order(comm, IDS), callbacks=list(seen), heads=heads,
                simulator=platform.SIMULATOR,
                results=results, stats=comm.stats(),
                device_priority={c: _device_priority(comm, c) for c in IDS})


@pytest.mark.parametrize("how", ["prepare", "override", "none"])
def test_late_high_priority_collective_overtakes_queued_lows(how):
    per_rank = pydfccl.launch(overtake_worker, 2, args=(how, SAMPLE_S), timeout=300)
    # From the completion queues. Rank 1 waited for each, so its order is fixed; on rank 0
    # only HIGH before the lows is (GO's and THEN's last step there may lag behind others).
    first, second = (out["order"] for out in per_rank)
    assert first.index(HIGH) < min(first.index(c) for c in LOWS), first
    assert second[:3] == [GO, HIGH, THEN] and sorted(second[3:]) == LOWS, second
    for rank, out in enumerate(per_rank):
        for c in IDS:
            assert out["results"][c] == _expected(2, c), (rank, c)
        want = {"prepare": 1, "override": 5, "none": 0}[how]
        assert out["device_priority"] == {c: want if c == HIGH else 0 for c in IDS}
    assert per_rank[0]["callbacks"][0] == HIGH and sorted(per_rank[0]["callbacks"]) == \
        sorted(LOWS + [HIGH]), per_rank[0]["callbacks"]
    if per_rank[0]["simulator"]:
        # (On a GPU a stuck daemon spends most of its time quit, between relaunches, and
        # the block status keeps showing the last task it loaded: sampling shows little.)
        heads = per_rank[0]["heads"]
        head = HIGH if how != "none" else min(LOWS)
        top, top_count = max(heads.items(), key=lambda kv: kv[1])
        others = max((n for c, n in heads.items() if c != head), default=0)
        print(how, "heads sampled on rank 0:", heads)
        assert top == head and top_count >= 2 * others, heads
    assert per_rank[0]["stats"]["preemptions"] > 0   # HIGH ran past the stuck lows


def test_without_preemption_the_same_program_deadlocks():
    """nccl runs rank 0's lows first, in submission order, and never lets go of them."""
    with pytest.raises(pydfccl.RankFailedError, match="deadlock"):
        pydfccl.launch(overtake_worker, 2, args=("prepare", 0.0), policy="nccl",
                       watchdog_timeout=3.0, timeout=120)
