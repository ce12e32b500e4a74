"""More collectives than the daemon's slots (``WorldConfig.max_colls``): they share the
slots (host/slots.py), on rank processes, written with the public API only."""

import pytest

import pydfccl

import many_workers


def _checked(per_rank):
    for out in per_rank:
        assert out["bad"] == []
    return sum(out["checked"] for out in per_rank)


def test_seventeen_collectives_run_on_the_simulator_defaults():
    """The simulator's default max_colls is 16."""
    per_rank = pydfccl.launch(many_workers.run_many, 2, args=(17, 17, 2), timeout=300)
    assert _checked(per_rank) >= 2 * 17


def test_every_kind_in_a_different_order_on_every_rank_through_few_slots():
    """Collectives of every kind (an all_to_all takes two slots on 3 ranks, a transfer two
    ranks only), several runs each, in an order of each rank's own, through 4 slots."""
    per_rank = pydfccl.launch(many_workers.run_many, 3, args=(42, 42, 3, 1), max_colls=4,
                              timeout=600)
    assert _checked(per_rank) > 3 * 100


def test_ten_thousand_registered_collectives():
    per_rank = pydfccl.launch(many_workers.run_many, 2, args=(10_000, 24, 2, 2),
                              timeout=600)
    assert _checked(per_rank) >= 2 * 24 * 2


def test_memory_does_not_grow_with_registrations():
    few, many = (pydfccl.launch(many_workers.run_many, 2, args=(n, 0, 0, 0, True),
                                timeout=300) for n in (8, 5_000))
    for a, b in zip(few, many):
        assert a["stats"]["device_bytes"] == b["stats"]["device_bytes"] > 0
        assert a["stats"]["pinned_bytes"] == b["stats"]["pinned_bytes"] > 0


def test_crossed_runs_complete_under_dfccl():
    assert pydfccl.launch(many_workers.crossed, 2, args=(20,), timeout=300) == [[3.0, 3.0]] * 2


def test_shared_runs_enter_every_sq_in_one_order_even_under_nccl():
    """Ranks submit two collectives in opposite orders: with slots of their own this
    deadlocks under nccl (tests/ranks/test_faults.py, the watchdog's report); runs that
    share slots enter every rank's SQ in the order of the leader's grants, so nccl's
    daemons, which run their SQ in order, agree."""
    assert pydfccl.launch(many_workers.crossed, 2, args=(20,), policy="nccl",
                          watchdog_timeout=5.0, timeout=120) == [[3.0, 3.0]] * 2


def test_a_failed_rank_fails_the_runs_waiting_for_a_grant(capfd):
    with pytest.raises(pydfccl.RankFailedError, match="rank 1: RuntimeError: rank 1 gives up"):
        pydfccl.launch(many_workers.one_rank_fails, 2, args=(20,), timeout=120)


def test_a_late_peer_is_waited_for_not_reported_as_a_deadlock():
    out = pydfccl.launch(many_workers.waits_for_a_peer, 2, args=(20, 5.0),
                         watchdog_timeout=2.0, timeout=300)
    assert out == [3.0, 3.0]


def test_collectives_prepared_after_start_share_the_slots_too():
    per_rank = pydfccl.launch(many_workers.late_shared, 3, max_colls=4, timeout=300)
    for rank, out in enumerate(per_rank):
        for cid in range(20, 30):
            want = ([cid * 10 + cid % 3] * 4 if cid % 3 == 0
                    else [sum(cid * 10 + r for r in range(3))] * 4)
            assert out[cid] == want
        assert out[0] == [3] * 4
    assert per_rank[1][99] == [7] * 3


def test_a_late_mismatch_among_shared_slots_names_the_field():
    with pytest.raises(pydfccl.RankFailedError,
                       # the leader compares as the ranks publish: one or both others
                       match=r"collective 25: field 'count' differs across ranks "
                             r"\(ranks \[0\]: 5; ranks \[(1|2|1, 2)\]: 4\)"):
        pydfccl.launch(many_workers.late_shared, 3, args=("count",), max_colls=4,
                       timeout=120)


def test_start_share_slots_lifts_the_limit_of_late_registrations():
    out = pydfccl.launch(many_workers.shared_from_start, 2, max_colls=2, timeout=300)
    assert out == [[2 * cid for cid in range(1, 31)]] * 2


def test_overflow_keeps_own_slots_and_shares_the_last_beyond_them():
    """8 slots on 2 ranks: 7 of the collectives' own (2 placed at start, 5 after), the last
    shared by the 15 beyond them and by a transfer."""
    out = pydfccl.launch(many_workers.overflow, 2, max_colls=8, timeout=300)
    sums = [2 * cid for cid in range(22)]
    assert out == [(sums, None, 1), (sums, [7, 7, 7], 1)]


def test_share_slots_must_be_the_same_on_every_rank():
    with pytest.raises(pydfccl.RankFailedError,
                       match=r"start\(share_slots=True\) on ranks \[0\] but not on ranks "
                             r"\[1\]: every rank must pass the same"):
        pydfccl.launch(many_workers.shared_from_start, 2, args=(True,), max_colls=2,
                       timeout=120)
    with pytest.raises(pydfccl.RankFailedError,
                       match=r"share_slots must be one of \(False, True, 'overflow'\), "
                             r"not 'all'"):
        pydfccl.launch(many_workers.shared_from_start, 1, args=(False, "all"), timeout=60)


def test_status_shows_runs_waiting_for_a_grant():
    out = pydfccl.launch(many_workers.waiting_status, 2, timeout=120)
    assert out == [{3: 1}, None]
