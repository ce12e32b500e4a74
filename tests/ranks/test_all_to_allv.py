"""all_to_allv: per-peer counts that each run gives, moved by the daemon as all_to_all's
steps over the run's blocks (kernels/plans.py, ``split_step``), preemptible like every
kind. Each output is compared with numpy's (``split_output``)."""

import numpy as np
import pytest

import pydfccl
import split_workers
from pydfccl.protocol.collectives import split_output


def _expected(nranks, capacity, run, rank):
    counts = split_workers.count_matrix(nranks, capacity, run)
    inputs = [split_workers.run_input(r, run, int(counts[r].sum())) for r in range(nranks)]
    return split_output(inputs, counts, rank).tolist()


def _check(nranks, capacity, runs, per_rank):
    for rank, result in enumerate(per_rank):
        assert len(result["outputs"]) == runs
        for k, got in enumerate(result["outputs"]):
            assert got == _expected(nranks, capacity, k, rank), f"rank {rank}, run {k}"


@pytest.mark.parametrize("nranks", [2, 3])
def test_uneven_counts_in_disorder_match_numpy(nranks):
    """Runs in flight together, beside an all_reduce submitted in another order on odd
    ranks: the all_to_allv is preempted and resumed on some rank."""
    runs = 6
    per_rank = pydfccl.launch(split_workers.uneven_runs, nranks, args=(40, runs, 3),
                              timeout=300)
    _check(nranks, 40, runs, per_rank)
    assert sum(r["stats"]["preemptions"] for r in per_rank) > 0


def test_blocks_span_channels_and_loops():
    """Small slots and three channels: a block takes several loops, and blocks shorter than
    the largest leave empty steps behind them."""
    per_rank = pydfccl.launch(split_workers.uneven_runs, 3, args=(150, 4, 2), timeout=300,
                              nblocks=3, slot_bytes=128)
    _check(3, 150, 4, per_rank)


def test_shared_slots():
    per_rank = pydfccl.launch(split_workers.uneven_runs, 3, args=(20, 4, 2, True),
                              timeout=300)
    _check(3, 20, 4, per_rank)


def test_a_pair_whose_counts_differ_is_named_on_every_rank():
    """Each slot carries its part's length: the receiver's daemon finds that it differs
    from the one it expects, and its host aborts every rank, naming the pair."""
    errors = pydfccl.launch(split_workers.disagreeing_pair, 2, timeout=120)
    for error in errors:
        assert error.startswith("AbortedError: bad counts: all_to_allv 0: rank 0 sends rank "
                                "1 another number of elements than rank 1's "
                                "recv_counts[0]"), error


def test_bad_counts_are_named():
    errors = pydfccl.launch(split_workers.bad_counts, 2, timeout=120)[1]
    assert "each run needs recv_counts=" in errors["missing"]
    assert "send_counts has 1 entries, needs one per rank (2)" in errors["short"]
    assert "has -1, outside 0..4" in errors["negative"]
    assert "has 5, outside 0..4" in errors["above"]
    assert "rank 1 sends itself 2 elements" in errors["self"]
    assert errors["floats"].startswith("TypeError: collective 0 (all_to_allv): send_counts "
                                       "must be integers")
    assert "send buffer has 4 elements, the run's counts need 2" in errors["size"]
    assert "send_counts and recv_counts are for all_to_allv" in errors["kind"]
