"""Collectives prepared after start(): placed alike on every rank without an exchange,
checked across ranks by the poller before their first run."""

import pytest

import pydfccl
from pydfccl.host.registration import LatePlacer

import rank_workers


def test_late_collectives_and_transfers_run():
    per_rank = pydfccl.launch(rank_workers.late_registration, 3, timeout=300)
    for rank, out in enumerate(per_rank):
        assert out["all_reduce"] == [6.0] * 5
        assert out["broadcast"] == [1] * 3
        if rank < 2:
            assert out["recv"] == [float(v + 10 * (1 - rank)) for v in range(4)]


@pytest.mark.parametrize("case, match", [
    ("count", r"collective 0: field 'count' differs across ranks \(ranks \[0\]: 5; ranks \[1\]: 6\)"),
    # whichever of the two collectives the poller compares first is reported
    ("order", r"collective 0: field 'kind' differs across ranks \(ranks \[0\]: 'all_reduce'; "
              r"ranks \[1\]: 'broadcast'\)|collective 1: field 'kind' differs across ranks "
              r"\(ranks \[0\]: 'broadcast'; ranks \[1\]: 'all_reduce'\)"),
    ("missing", r"collective 0 \(all_reduce, count 4, float32\) was prepared on rank 0 but "
                r"ranks \[1\] closed their communicator without preparing it"),
])
def test_late_mismatch_fails_with_the_difference(case, match):
    with pytest.raises(pydfccl.RankFailedError, match=match):
        pydfccl.launch(rank_workers.late_mismatch, 2, args=(case,), watchdog_timeout=4.0,
                       timeout=120)


def test_a_peer_late_to_prepare_is_waited_for_past_the_watchdog(capfd):
    """Rank 1 prepares the collective 6 s after rank 0, past the watchdog (3 s): a late
    peer, not a wrong one; the watchdog's report says what waits for it, and the run
    completes (a torch rank that saves a checkpoint before its first barrier is this
    case)."""
    out = pydfccl.launch(rank_workers.late_preparer, 2, args=(6.0,), watchdog_timeout=3.0,
                         timeout=300)
    assert out == [[2.0] * 4, [2.0] * 4]
    assert ("collective 0 (all_reduce), prepared after start() on ranks [0], is not yet "
            "prepared on ranks [1]") in capfd.readouterr().err


def test_placer_keeps_transfers_and_collectives_apart():
    placer = LatePlacer(nranks=3, max_colls=12, next_index=1, next_conn=1)
    assert placer.collective("all_reduce") == (1, 1)
    assert placer.collective("all_to_all") == (2, 2)          # two connector sets
    assert placer.collective("broadcast") == (3, 4)
    # (sender, receiver) pairs take 11 - pair, the next ordinal 6 places lower.
    assert placer.transfer(0, 1) == (11, 11)
    assert placer.transfer(1, 0) == (11 - 3, 11 - 3)
    assert placer.transfer(0, 1) == (11 - 6, 11 - 6)
    assert placer.transfer(2, 1) == (11 - 5, 11 - 5)
    with pytest.raises(ValueError, match="no room for another transfer from rank 2 to rank 1"):
        placer.transfer(2, 1)       # would take 11 - 5 - 6 = 0, below the collectives
    with pytest.raises(ValueError, match="make max_colls larger"):
        placer.collective("all_reduce")   # conn 5 meets the transfer at 5
