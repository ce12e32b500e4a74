"""The slot leader (host/slots.py): grants only what every rank asked for, binds a slot
anew only once every rank completed its runs there, and grants in order."""

import numpy as np
import pytest

from pydfccl.host.registration import SHARE, shared_by_all
from pydfccl.protocol import layout as L
from pydfccl.host.slots import COMPANION, SlotLeader

EVERYONE = (0, 1)


def _leader(nslots=2, members=None):
    ctl = np.zeros(2, L.CTL_ROW)
    members = members or {c: (1, EVERYONE) for c in range(10)}
    return ctl, SlotLeader(ctl, 2, nslots, members)


def _ask(ctl, rank, *coll_ids):
    for coll_id in coll_ids:
        k = int(ctl["req_head"][rank])
        ctl["req"][rank, k % L.REQUEST_CAP] = coll_id
        ctl["req_head"][rank] = k + 1


def _binding(ctl, slot):
    """(coll_id, runs granted in its epoch) at ``slot``."""
    epoch = ctl["bind_epoch"][0, slot]
    head = int(ctl["grant_head"][0])
    runs = sum(int(ctl["grant_runs"][0, k]) for k in range(head)
               if ctl["grant_slot"][0, k] == slot and ctl["grant_epoch"][0, k] == epoch)
    return int(ctl["bind_coll"][0, slot]), runs


def _complete(ctl, slot, runs, ranks=EVERYONE):
    for r in ranks:
        ctl["slot_done"][r, slot] += runs


def test_a_collective_is_granted_once_every_rank_asked_for_it():
    ctl, leader = _leader()
    _ask(ctl, 0, 5, 6)
    assert not leader.poll() and leader.busy() is False
    _ask(ctl, 1, 6)                      # rank 1 asks in another order
    assert leader.poll()
    assert _binding(ctl, 0) == (6, 1) and int(ctl["bind_epoch"][0, 0]) == 2
    _ask(ctl, 1, 5, 6)
    assert leader.poll()
    assert _binding(ctl, 1) == (5, 1)
    assert _binding(ctl, 0) == (6, 1)    # rank 0 asked 6 once: nothing more for it
    assert list(ctl["req_seen"]) == list(ctl["req_head"])


def test_more_runs_of_a_bound_collective_are_granted_in_its_slot():
    ctl, leader = _leader()
    _ask(ctl, 0, 3, 3, 3)
    _ask(ctl, 1, 3, 3)
    leader.poll()
    assert _binding(ctl, 0) == (3, 2)
    _ask(ctl, 1, 3)
    leader.poll()
    assert _binding(ctl, 0) == (3, 3) and int(ctl["bind_epoch"][0, 0]) == 2


def test_a_slot_is_bound_anew_only_once_every_rank_completed_its_runs():
    ctl, leader = _leader(nslots=1)
    for r in EVERYONE:
        _ask(ctl, r, 1, 2)
    leader.poll()
    assert _binding(ctl, 0) == (1, 1)
    _complete(ctl, 0, 1, ranks=(0,))
    assert not leader.poll() and leader.busy()      # rank 1 has not completed it
    _complete(ctl, 0, 1, ranks=(1,))
    assert leader.poll()
    assert _binding(ctl, 0) == (2, 1) and int(ctl["bind_epoch"][0, 0]) == 4


def test_grants_keep_the_order_collectives_became_ready():
    """While the first ready collective waits for a slot, none after it is granted, not
    even in a slot of its own: the runs in flight complete and free its slot."""
    ctl, leader = _leader(nslots=1)
    for r in EVERYONE:
        _ask(ctl, r, 1)
    leader.poll()
    for r in EVERYONE:
        _ask(ctl, r, 2, 1)
    leader.poll()
    assert _binding(ctl, 0) == (1, 1)      # 2 waits for the slot; 1 must wait behind it
    _complete(ctl, 0, 1)
    leader.poll()
    assert _binding(ctl, 0) == (2, 1)
    _complete(ctl, 0, 1)
    leader.poll()
    assert _binding(ctl, 0) == (1, 1)


def test_an_all_to_all_takes_consecutive_slots():
    members = {0: (1, EVERYONE), 1: (3, EVERYONE)}
    ctl, leader = _leader(nslots=4, members=members)
    for r in EVERYONE:
        _ask(ctl, r, 0)
    leader.poll()
    for r in EVERYONE:
        _ask(ctl, r, 1)
    leader.poll()
    assert _binding(ctl, 1) == (1, 1)
    assert [_binding(ctl, s)[0] for s in (2, 3)] == [COMPANION, COMPANION]


def test_slots_below_the_first_shared_one_are_never_bound():
    """start(share_slots="overflow"): slots 0 and 1 are collectives' own; 2 and 3 shared,
    a collective bound anew there and an all_to_all in both."""
    ctl = np.zeros(2, L.CTL_ROW)
    members = {c: (1, EVERYONE) for c in range(3)} | {9: (2, EVERYONE)}
    leader = SlotLeader(ctl, 2, 4, members, first=2)
    for cid in (0, 1, 2):
        for r in EVERYONE:
            _ask(ctl, r, cid)
        leader.poll()
        _complete(ctl, leader.bound[cid], 1)
    assert [_binding(ctl, s)[0] for s in (2, 3)] == [2, 1]     # 0 was bound at 2 first
    for r in EVERYONE:
        _ask(ctl, r, 9)
    leader.poll()
    assert [_binding(ctl, s)[0] for s in (2, 3)] == [9, COMPANION]
    assert not ctl["bind_epoch"][0, :2].any() and leader.owner[:2] == [-1, -1]


def test_a_transfer_waits_for_its_two_ranks_only():
    ctl = np.zeros(3, L.CTL_ROW)
    leader = SlotLeader(ctl, 3, 2, {7: (1, (1, 2))})
    _ask(ctl, 1, 7)
    leader.poll()
    assert int(ctl["bind_epoch"][0, 0]) == 0        # never bound
    _ask(ctl, 2, 7)
    leader.poll()
    assert _binding(ctl, 0) == (7, 1)


def _publish(ctl, rank, coll_id, count, kind=1):
    k = int(ctl["late_head"][rank])
    ctl["late"][rank, k % L.LATE_CAP] = (0, coll_id, kind, 0, 0, count, 0, 0)
    ctl["late_head"][rank] = k + 1


def test_a_late_collective_is_granted_once_every_rank_published_it():
    ctl, leader = _leader(members={})
    _publish(ctl, 0, 40, 4)
    _ask(ctl, 0, 40)
    _ask(ctl, 1, 40)
    leader.poll()
    assert int(ctl["bind_epoch"][0, 0]) == 0     # rank 1 has not published it yet
    _publish(ctl, 1, 40, 4)
    leader.poll()
    assert _binding(ctl, 0) == (40, 1)


def test_a_late_collective_published_differently_fails_every_rank():
    ctl, leader = _leader(members={})
    failures = []
    leader.fail = failures.append
    _publish(ctl, 0, 41, 4)
    _publish(ctl, 1, 41, 5)
    leader.poll()
    assert [str(e) for e in failures] == [
        "collective 41: field 'count' differs across ranks (ranks [0]: 4; ranks [1]: 5)"]


def test_every_rank_must_start_with_the_same_share_slots():
    """start()'s exchange carries each rank's share_slots beside its signatures."""
    sig = {0: {"kind": "all_reduce"}}
    plain, mode = shared_by_all([dict(sig, **{SHARE: "overflow"})] * 2)
    assert plain == [sig, sig] and mode == "overflow"
    with pytest.raises(ValueError, match=r"start\(share_slots='overflow'\) on ranks \[1\] "
                                         r"but not on ranks \[0, 2\]"):
        shared_by_all([sig, dict(sig, **{SHARE: "overflow"}), sig])
    with pytest.raises(ValueError, match=r"differs across ranks \(ranks \[0\]: True; "
                                         r"ranks \[1\]: 'overflow'\)"):
        shared_by_all([dict(sig, **{SHARE: True}), dict(sig, **{SHARE: "overflow"})])
