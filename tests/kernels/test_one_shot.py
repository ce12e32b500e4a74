"""The one-shot all_reduce for small messages (kernels/plans.py): which sizes take it, and
that it reduces every rank's input in rank order, exactly, when preempted and resumed."""

import re
import time

import numpy as np
import pytest

import pydfccl
import one_shot_workers
import shared_workers
from pydfccl.cli.demo import DemoOptions, run_demo
from pydfccl.kernels.plans import ONE_SHOT
from pydfccl.protocol.one_shot import ONE_SHOT_BYTES, lane_bytes, one_shot, table_kind
from pydfccl.protocol.reference import _reduce, reference
from pydfccl.host.world_config import machine_sizes

SLOT = 256      # a slot size for the arithmetic of lanes (the simulator's default)


def test_lanes_cut_a_slot_in_16_byte_multiples():
    assert lane_bytes(2, SLOT) == 256
    assert lane_bytes(3, SLOT) == 128
    assert lane_bytes(4, SLOT) == 80          # 85 rounded down to 16 bytes
    assert lane_bytes(8, 128 * 1024) == 18720


@pytest.mark.parametrize("nranks", [2, 3, 4, 8, 17])
def test_sizes_up_to_a_lane_and_the_limit_go_one_shot(nranks):
    lane = lane_bytes(nranks, SLOT)
    assert one_shot(lane // 4, 4, nranks, SLOT)
    assert not one_shot(lane // 4 + 1, 4, nranks, SLOT)
    big = 1024 * 1024
    assert one_shot(ONE_SHOT_BYTES // 8, 8, nranks, big)
    assert not one_shot(ONE_SHOT_BYTES // 8 + 1, 8, nranks, big)


def test_one_rank_and_too_many_ranks_keep_the_ring():
    assert not one_shot(1, 4, 1, SLOT)
    assert not one_shot(1, 4, 18, 1024 * 1024)      # more senders than a connector's lanes
    assert table_kind("all_reduce", 1, 4, 1, SLOT) == pydfccl.protocol.codes.KINDS["all_reduce"]
    assert table_kind("all_reduce", 1, 4, 2, SLOT) == ONE_SHOT
    assert table_kind("reduce", 1, 4, 2, SLOT) == pydfccl.protocol.codes.KINDS["reduce"]


def _cases(nranks):
    """One-shot sizes (the most, and less) and the first ring size, in 16-bit floats whose
    sums round differently in another order, and in other dtypes and ops; for the slots a
    launch on this machine takes."""
    _, slot_bytes = machine_sizes(nranks)
    most = min(lane_bytes(nranks, slot_bytes), ONE_SHOT_BYTES)
    return [("all_reduce", most // 2, "float16", "sum", 0),
            ("all_reduce", most // 2 + 1, "float16", "sum", 0),      # the ring
            ("all_reduce", 3, "bfloat16", "avg", 0),
            ("all_reduce", most, "int8", "sum", 0),
            ("all_reduce", 1, "float32", "max", 0),
            ("all_reduce", 5, "float64", "prod", 0),
            ("all_reduce", most // 4, "int32", "avg", 0)]


@pytest.mark.parametrize("nranks", [2, 4])
def test_small_all_reduces_run_one_shot_in_rank_order(nranks):
    cases = _cases(nranks)
    per_rank = pydfccl.launch(shared_workers.traced_collective_cases, nranks, args=(cases,),
                              timeout=300, policy=pydfccl.get_policy("dfccl").with_params(
                                  ORDER_BY_ID=0))
    for i, (kind, count, dtype, op, root) in enumerate(cases):
        want = shared_workers.expected_collective(kind, nranks, 0, count, dtype, op, root, i)
        for rank, out in enumerate(per_rank):
            got = np.array(out["results"][i], dtype=dtype)
            assert np.array_equal(got, want), f"rank {rank}: {cases[i]}"
    if nranks > 2:      # two ranks' sums are the same in either order
        # The 16-bit sums tell the orders apart: the ring's (chunk c of the one loop from
        # rank c + 1 round) would not have matched.
        count = cases[0][1]
        inputs = [shared_workers.rank_inputs(r, count, "float16", 0) for r in range(nranks)]
        ring_first = (np.arange(count) // -(-count // nranks) + 1) % nranks
        assert not np.array_equal(_reduce(inputs, "sum", ring_first),
                                  reference("all_reduce", inputs, "sum"))
    # Preempted and resumed: the one-shot steps in their own primitives, the ring in its.
    preempted = {}
    for out in per_rank:
        for i, names in out["preempted_in"].items():
            preempted.setdefault(i, set()).update(names)
    assert sum(out["stats"]["preemptions"] for out in per_rank) > 0
    one_shot_names = {"sendAll", "recvReduceCopyAll"}
    assert set().union(*(preempted.get(i, set()) for i in (0, 2, 3, 4, 5, 6))) <= one_shot_names
    assert "recvReduceCopyAll" in set().union(*preempted.values())
    assert not preempted.get(1, set()) & one_shot_names


def test_chaos_demo_of_one_shot_all_reduces():
    """Small all_reduces in disorder: dfccl preempts the one-shot steps and completes them;
    the nccl policy deadlocks, and the watchdog names the cycle."""
    per_rank = run_demo(DemoOptions(nranks=3, colls=4, iters=2, count=8, progress=False))
    assert [r["verified"] for r in per_rank] == [8, 8, 8]
    assert sum(r["preemptions"] for r in per_rank) > 0
    started = time.monotonic()
    with pytest.raises(pydfccl.RankFailedError, match="deadlock") as info:
        run_demo(DemoOptions(nranks=3, colls=4, iters=2, count=8, policy="nccl",
                             progress=False), watchdog_timeout=3.0)
    assert "wait-for cycle: rank" in str(info.value)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("late", [False, True])
def test_ranks_that_disagree_on_one_shot_are_refused(late):
    """One rank's PYDFCCL_ONE_SHOT_BYTES differs: its all_reduce would wait on the ring's
    counters while the others wait on lanes. start(), or the first run of a collective
    prepared after it, names the field instead."""
    # after start() each rank compares the ranks that have published so far, so the
    # other side may be rank 0, rank 2 or both
    with pytest.raises(pydfccl.RankFailedError,
                       match=r"collective 0: field 'one_shot' differs across ranks") as info:
        pydfccl.launch(one_shot_workers.one_shot_limits_differ, 3, args=(late,), watchdog_timeout=4.0,
                       timeout=120)
    text = str(info.value)
    assert "ranks [1]: False" in text
    assert re.search(r"ranks \[(0, 2|0|2)\]: True", text), text
