"""More collectives than the daemon's slots on a GPU (host/slots.py): 10,000 registered,
hundreds run in an order of each rank's own, through the daemon's 32 slots (and through 4),
on rank threads and rank processes; every result checked, memory the same as with a few.
Public API only (``tests/many_workers.py``)."""

import pytest

import pydfccl
from pydfccl import platform

import many_workers

pytestmark = pytest.mark.skipif(not platform.gpu_available(), reason="needs a GPU")


def _checked(per_rank):
    for out in per_rank:
        assert out["bad"] == []
    return sum(out["checked"] for out in per_rank)


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_ten_thousand_collectives_share_the_slots(backend):
    per_rank = pydfccl.launch(many_workers.run_many, 4, args=(10_000, 200, 3, 5),
                              backend=backend, timeout=600)
    assert _checked(per_rank) >= 4 * 150 * 3


def test_every_kind_through_four_slots_with_preemption():
    """42 collectives of every kind, 6 runs each in disorder, through 4 slots: bindings
    replace one another while runs are preempted and resumed."""
    per_rank = pydfccl.launch(many_workers.run_many, 4, args=(42, 42, 6, 11), max_colls=4,
                              timeout=600)
    assert _checked(per_rank) >= 4 * 30 * 6


def test_memory_does_not_grow_with_registrations():
    few, many = (pydfccl.launch(many_workers.run_many, 2, args=(n, 0, 0, 0, True),
                                timeout=300) for n in (8, 10_000))
    for a, b in zip(few, many):
        assert a["stats"]["device_bytes"] == b["stats"]["device_bytes"] > 0
        assert a["stats"]["pinned_bytes"] == b["stats"]["pinned_bytes"] > 0


def test_crossed_runs_of_shared_slots_complete_under_nccl():
    assert pydfccl.launch(many_workers.crossed, 2, args=(40,), policy="nccl",
                          watchdog_timeout=10.0, timeout=300) == [[3.0, 3.0]] * 2
