"""Every collective kind against numpy: uneven counts, every op, several dtypes, roots,
and a rotated submission order so that the kinds are preempted and resumed too."""

import numpy as np
import pytest

import pydfccl
import workers
from pydfccl import platform

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
]


def _check(nranks, cases, per_rank):
    for rank, outputs in enumerate(per_rank):
        for i, (kind, count, dtype, op, root) in enumerate(cases):
            root = root % nranks
            want = workers.expected_collective(kind, nranks, rank, count, dtype, op, root, i)
            if want is None:
                continue
            got = np.array(outputs[i], dtype=dtype)
            assert np.array_equal(got, want), f"rank {rank}: {cases[i]}"


# On a GPU (ranks as threads, cheap) the matrix also runs at 4 and 8 ranks.
RANK_COUNTS = [2, 3] + ([4, 8] if platform.gpu_available() else [])


@pytest.mark.parametrize("nranks", RANK_COUNTS)
def test_every_kind_matches_numpy(nranks):
    cases = [(k, c, d, o, r % nranks) for k, c, d, o, r in CASES]
    _check(nranks, cases, pydfccl.launch(workers.collective_cases, nranks, args=(cases, True),
                                         timeout=300))


def test_single_rank_kinds_are_copies():
    cases = [(k, c, d, o, 0) for k, c, d, o, _ in CASES]
    _check(1, cases, pydfccl.launch(workers.collective_cases, 1, args=(cases,), timeout=120))


def test_kinds_across_channels():
    cases = [("all_gather", 300, "float32", "sum", 0), ("reduce_scatter", 300, "int32", "sum", 0),
             ("broadcast", 500, "int64", "sum", 1), ("reduce", 500, "float64", "max", 0)]
    _check(2, cases, pydfccl.launch(workers.collective_cases, 2, args=(cases, True),
                                    timeout=300, nblocks=3, slot_bytes=128))


def test_chaos_demo_mixes_every_kind():
    from pydfccl.demo import DemoOptions, run_demo

    opts = DemoOptions(nranks=3, colls=5, iters=2, count=30, progress=False,
                       kinds=("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                              "reduce"))
    per_rank = run_demo(opts)
    # every output checked: 5 per iteration on each rank, but a reduce only at its root
    assert sum(r["verified"] for r in per_rank) == 2 * (4 * 3 + 1)
