"""Point-to-point send/recv: registered on two ranks only, any count, repeated runs, in an
order that differs by rank, next to a collective; and the checks of the pairing."""

import numpy as np
import pytest

import pydfccl
import rank_workers
import shared_workers

# (coll_id, sender, receiver, count, dtype): a cycle 0 -> 2 -> 1 -> 0 and a second 0 -> 2
TRANSFERS = [(0, 0, 2, 150, "float32"), (1, 2, 1, 1, "int64"), (2, 1, 0, 300, "int8"),
             (3, 0, 2, 65, "float64")]


def test_transfers_arrive_intact_run_after_run():
    runs = 3
    per_rank = pydfccl.launch(rank_workers.point_to_point, 3, args=(TRANSFERS, runs), timeout=300)
    for cid, sender, receiver, count, dtype in TRANSFERS:
        got = per_rank[receiver][cid]
        assert len(got) == runs
        for run, values in enumerate(got):
            want = shared_workers.rank_inputs(sender, count, dtype, cid + 10 * run)
            assert np.array_equal(np.array(values, dtype=dtype), want), (cid, run)
    assert set(per_rank[1]) == {1} and set(per_rank[0]) == {2} and set(per_rank[2]) == {0, 3}


@pytest.mark.parametrize("case, message", [
    ("both send", "one 'send' and one 'recv'"),
    ("wrong peer", "each must name the other"),
    ("count", "field 'count' differs"),
])
def test_mismatched_pairs_are_refused_at_start(case, message):
    nranks = 3 if case == "wrong peer" else 2
    with pytest.raises(pydfccl.RankFailedError, match=message):
        pydfccl.launch(rank_workers.bad_pair, nranks, args=(case,), timeout=120)


def test_crossed_receives_complete_under_dfccl_and_deadlock_under_nccl():
    out = pydfccl.launch(rank_workers.receive_before_sending, 2, timeout=300)
    assert out == [[8] * 100, [7] * 100]
    with pytest.raises(pydfccl.RankFailedError) as info:
        pydfccl.launch(rank_workers.receive_before_sending, 2, policy="nccl", watchdog_timeout=3.0,
                       timeout=120)
    report = str(info.value)
    # Each rank's receive (registered under the sender's rank as its id) waits for the other.
    assert "recv 1 (block 0) waits for data from rank 1, which is on recv 0" in report
    assert "recv 0 (block 0) waits for data from rank 0, which is on recv 1" in report
    assert "wait-for cycle: rank 0 -> rank 1 -> rank 0" in report
