"""Buffers the user drops before its collective completes: pydfccl keeps them alive until
then (the future holds them); only buffers whose future was dropped too are reported (a
warning, ``stats()["dropped_buffers"]``), never buffers the user keeps or views of arrays it
keeps."""

import numpy as np

import pydfccl
import rank_workers
import shared_workers
from pydfccl.host.buffers import dropped_by_user

def _want(nranks):
    reduced = sum(shared_workers.rank_inputs(r, 5, "int64", 0) for r in range(nranks))
    gathered = np.concatenate([shared_workers.rank_inputs(r, 3, "int64", 1) for r in range(nranks)])
    return [reduced.tolist(), gathered.tolist()]


def test_buffers_dropped_while_their_futures_are_kept_live_on_silently():
    """The futures hold their buffers: a user who keeps the future can still read its
    result, so nothing was dropped by mistake (``test_arrays.py`` drops the futures too)."""
    per_rank = pydfccl.launch(rank_workers.dropped_or_kept_buffers, 2, args=(True,), timeout=300)
    for out in per_rank:
        assert out["results"] == _want(2)
        assert out["stats"]["dropped_buffers"] == 0
        assert out["warnings"] == []


def test_kept_buffers_and_views_of_kept_arrays_are_not_reported():
    per_rank = pydfccl.launch(rank_workers.dropped_or_kept_buffers, 2, args=(False,), timeout=300)
    for out in per_rank:
        assert out["results"] == _want(2)
        assert out["stats"]["dropped_buffers"] == 0
        assert out["warnings"] == []


def test_what_counts_as_dropped():
    kept, base = np.zeros(3), np.zeros(10)
    in_place = (np.zeros(3),) * 2
    assert dropped_by_user((np.zeros(3), np.zeros(3))) == ["send", "recv"]
    assert dropped_by_user((kept, np.zeros(3))) == ["recv"]
    assert dropped_by_user((kept, kept)) == []
    assert dropped_by_user(in_place) == ["in-place"]
    assert dropped_by_user((base[:5], base[5:])) == []            # views of a kept array
    assert dropped_by_user((np.zeros(10)[:5], kept)) == ["send"]   # a view of a dropped one
    held = [np.zeros(3)]
    assert dropped_by_user((held[0], held[0])) == []
