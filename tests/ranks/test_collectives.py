"""Every collective kind against numpy: uneven counts, every op, several dtypes, roots,
and a rotated submission order so that the kinds are preempted and resumed too.
Point-to-point transfers are in test_point_to_point.py."""

import numpy as np
import pytest

import pydfccl
import rank_workers
import shared_workers
from pydfccl import platform
from pydfccl.protocol.reference import reference

CASES = [  # (kind, count, dtype, op, root)
    ("all_gather", 1, "float32", "sum", 0),
    ("all_gather", 100, "int64", "sum", 0),
    ("reduce_scatter", 1, "float64", "sum", 0),
    ("reduce_scatter", 77, "int32", "max", 0),
    ("reduce_scatter", 65, "float32", "avg", 0),
    ("broadcast", 1, "int8", "sum", 0),
    ("broadcast", 150, "float32", "sum", 1),
    ("reduce", 3, "uint8", "min", 1),
    ("reduce", 129, "int64", "prod", 0),
    ("reduce", 70, "float32", "avg", 2),
    ("all_reduce", 90, "float64", "sum", 0),
    ("all_to_all", 1, "int32", "sum", 0),
    ("all_to_all", 70, "float32", "avg", 0),    # the op plays no part
]


def _check(nranks, cases, per_rank, **sizes):
    for rank, outputs in enumerate(per_rank):
        for i, (kind, count, dtype, op, root) in enumerate(cases):
            root = root % nranks
            want = shared_workers.expected_collective(kind, nranks, rank, count, dtype, op, root, i,
                                               **sizes)
            if want is None:
                continue
            got = np.array(outputs[i], dtype=dtype)
            assert np.array_equal(got, want), f"rank {rank}: {cases[i]}"


# On a GPU (ranks as threads, cheap) the matrix also runs at 4 and 8 ranks.
RANK_COUNTS = [2, 3] + ([4, 8] if platform.gpu_available() else [])


@pytest.mark.parametrize("nranks", RANK_COUNTS)
def test_every_kind_matches_numpy(nranks):
    cases = [(k, c, d, o, r % nranks) for k, c, d, o, r in CASES]
    _check(nranks, cases, pydfccl.launch(shared_workers.collective_cases, nranks, args=(cases, True),
                                         timeout=300))


def test_single_rank_kinds_are_copies():
    cases = [(k, c, d, o, 0) for k, c, d, o, _ in CASES]
    _check(1, cases, pydfccl.launch(shared_workers.collective_cases, 1, args=(cases,), timeout=120))


def test_kinds_across_channels():
    cases = [("all_gather", 300, "float32", "sum", 0), ("reduce_scatter", 300, "int32", "sum", 0),
             ("broadcast", 500, "int64", "sum", 1), ("reduce", 500, "float64", "max", 0),
             ("all_to_all", 100, "int64", "sum", 0)]
    _check(2, cases, pydfccl.launch(shared_workers.collective_cases, 2, args=(cases, True),
                                    timeout=300, nblocks=3, slot_bytes=128))


# float16 and bfloat16: every kind, every op of the reducing kinds, counts of 1 and around
# the simulator's slot (256 bytes: 128 elements; an all_reduce loop holds nranks slots).
# Their inputs are values with more bits than the type holds (shared_workers.rank_inputs), so every
# ring step rounds and the results match only the reference that reduces in the ring's
# order with the same rounding: they are compared exactly.
HALF_CASES = [  # (kind, count, op, root)
    ("all_reduce", 300, "sum", 0), ("all_reduce", 1, "prod", 0),
    ("all_reduce", 129, "max", 0), ("all_reduce", 77, "min", 0),
    ("all_reduce", 257, "avg", 0),
    ("reduce_scatter", 130, "sum", 0), ("reduce_scatter", 3, "prod", 0),
    ("reduce_scatter", 1, "max", 0), ("reduce_scatter", 64, "min", 0),
    ("reduce_scatter", 129, "avg", 0),
    ("reduce", 1, "sum", 1), ("reduce", 200, "prod", 0), ("reduce", 5, "max", 2),
    ("reduce", 128, "min", 1), ("reduce", 131, "avg", 2),
    ("all_gather", 1, "sum", 0), ("all_gather", 129, "avg", 0),
    ("broadcast", 1, "max", 1), ("broadcast", 150, "sum", 2),
]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("nranks", [2, 3])
def test_16bit_floats_round_at_every_ring_step(nranks, dtype):
    cases = [(k, c, dtype, o, r % nranks) for k, c, o, r in HALF_CASES]
    _check(nranks, cases, pydfccl.launch(shared_workers.collective_cases, nranks, args=(cases, True),
                                         timeout=300, max_colls=len(cases)))


def test_16bit_floats_across_channels():
    """Several blocks and small slots: an all_reduce's ring order changes with them, and the
    reference is given the same sizes."""
    sizes = dict(nblocks=3, slot_bytes=64)
    cases = [("all_reduce", 200, "float16", "sum", 0), ("all_reduce", 170, "bfloat16", "avg", 0),
             ("reduce_scatter", 100, "bfloat16", "sum", 0), ("reduce", 90, "float16", "prod", 1)]
    _check(3, cases, pydfccl.launch(shared_workers.collective_cases, 3, args=(cases, True),
                                    timeout=300, **sizes), **sizes)


def test_chaos_demo_mixes_every_kind():
    from pydfccl.cli.demo import DemoOptions, run_demo

    opts = DemoOptions(nranks=3, colls=5, iters=2, count=30, progress=False,
                       kinds=("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                              "reduce"))
    per_rank = run_demo(opts)
    # every output checked: 5 per iteration on each rank, but a reduce only at its root
    assert sum(r["verified"] for r in per_rank) == 2 * (4 * 3 + 1)


def test_demo_kinds_all_includes_all_to_allv():
    """``demo --kinds all`` as a user runs it (progress bar on): every kind, an all_to_allv
    with empty blocks and blocks of different sizes, in disorder."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pydfccl", "demo", "-n", "3", "-k", "7",
                           "-i", "3", "-c", "37", "--kinds", "all"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reduce_scatter, broadcast, reduce, all_to_all, all_to_allv)" in done.stdout
    # 7 collectives on 3 ranks for 3 iterations; a reduce's output only at its root
    assert "outputs verified: 57 " in done.stdout, done.stdout


def test_integer_average_truncates_toward_zero_as_nccl():
    want = [-1, 0, 1, -2]    # sums -3, -1, 3, -5 over 2 ranks; floor would give -2, -1, 1, -3
    assert pydfccl.launch(rank_workers.negative_average, 2, timeout=120) == [want, want]
    inputs = [np.array([-3, -1, 2, -7], np.int32), np.array([0, 0, 1, 2], np.int32)]
    assert reference("all_reduce", inputs, "avg").tolist() == want


def test_channels_of_less_than_a_loop_with_large_slots():
    """With slots above ``ring.MIN_CHANNEL_CHUNK`` a collective spreads over blocks in
    shares smaller than one loop (a slot per chunk), which the daemon then moves as one
    short loop: 20,000 float64 on 2 ranks make 2 channels of 10,000 elements where a loop
    holds 32,768."""
    from pydfccl.kernels.ring import channel_count

    sizes = dict(nblocks=2, slot_bytes=128 * 1024)
    cases = [("all_reduce", 20000, "float64", "sum", 0), ("all_gather", 10000, "int64", "sum", 0),
             ("reduce_scatter", 10000, "float64", "max", 0)]
    assert channel_count(True, 20000, 8, 2, **sizes) == 2
    assert channel_count(False, 10000, 8, 2, **sizes) == 2
    _check(2, cases, pydfccl.launch(shared_workers.collective_cases, 2, args=(cases, True),
                                    timeout=600, **sizes), **sizes)
