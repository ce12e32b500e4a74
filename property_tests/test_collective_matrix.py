"""The collective matrix: random kind x op x dtype x count x rank count x root on the CUDA
simulator, every output compared with numpy (``pydfccl.protocol.reference``).

Each example is one launch of 2-3 rank processes (seconds) running 1-3 collectives, so the
example budget is small and fixed here, whatever the profile, and there is no shrinking
(each step would be another launch; the examples are small already). The comparison is
exact for every dtype: the reference reduces floats in the ring's order with the engine's
rounding (float16 and bfloat16 round to 16 bits after every step), so no tolerance is
needed. Inputs are kept where every dtype is free of overflow and NaN: 8-bit integers in
0..5 (signed: -5..5), wider integers in -1000..1000 (a product of three fits int32), floats
in [-4, 4) ([-2, 2) for products), with more bits than float16 and bfloat16 hold, so their
sums round at every step.
"""

import os
from dataclasses import dataclass

import numpy as np
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import pydfccl
from pydfccl import platform
from pydfccl.protocol.reference import buffer_elems, reference

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
OPS = ("sum", "prod", "max", "min", "avg")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
# 1, and counts around a slot: the simulator's 256-byte slot holds 32..256 elements; an
# all_reduce of up to a lane (256 bytes on 2 ranks, 128 on 3) runs one-shot
COUNTS = st.one_of(st.sampled_from([1, 2, 31, 32, 33, 128, 129, 257]), st.integers(1, 300))
LAUNCH_TIMEOUT = 180.0

EXAMPLES = 40 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 8
engine_settings = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                           phases=[Phase.explicit, Phase.reuse, Phase.generate],
                           suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Coll:
    kind: str
    op: str
    dtype: str
    count: int
    root: int


def values(seed: int, index: int, rank: int, coll: Coll, elems: int) -> np.ndarray:
    """Rank ``rank``'s send buffer for collective ``index`` (the same in the rank process
    and in the test)."""
    rng = np.random.default_rng([seed, index, rank])
    dtype = np.dtype(coll.dtype)
    if np.issubdtype(dtype, np.integer):
        bound = 5 if dtype.itemsize == 1 else 1000
        low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -bound
        return rng.integers(low, bound + 1, elems).astype(dtype)
    bound = 2.0 if coll.op == "prod" else 4.0
    return rng.uniform(-bound, bound, elems).astype(dtype)


def matrix_worker(comm, colls, seed):
    """Prepare and run every collective once (recv poisoned first); return the outputs."""
    for i, c in enumerate(colls):
        comm.prepare(i, c.kind, count=c.count, dtype=c.dtype, op=c.op, root=c.root)
    comm.start()
    runs = []
    for i, c in enumerate(colls):
        send_elems, recv_elems = buffer_elems(c.kind, c.count, comm.nranks)
        send = comm.empty(send_elems, c.dtype)
        platform.copy_in(send, values(seed, i, comm.rank, c, send_elems))
        recv = comm.empty(recv_elems, c.dtype)
        platform.copy_in(recv, np.full(recv_elems, 99, c.dtype))
        runs.append((comm.run(i, send, recv), send, recv))
    return [platform.to_numpy(future.result(timeout=120), c.dtype).copy()
            for (future, _, _), c in zip(runs, colls)]


@st.composite
def matrices(draw):
    """(nranks, collectives, seed): 2-3 ranks, 1-3 collectives of any kind, op and dtype."""
    nranks = draw(st.integers(2, 3))
    colls = draw(st.lists(st.builds(Coll, kind=st.sampled_from(KINDS), op=st.sampled_from(OPS),
                                    dtype=st.sampled_from(DTYPES), count=COUNTS,
                                    root=st.integers(0, nranks - 1)),
                          min_size=1, max_size=3))
    return nranks, colls, draw(st.integers(0, 2**32 - 1))


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    if np.issubdtype(want.dtype, np.integer):
        return got.dtype == want.dtype and np.array_equal(got, want)
    return got.dtype == want.dtype and np.array_equal(got.astype(np.float64),
                                                      want.astype(np.float64), equal_nan=True)


def _difference(got: np.ndarray, want: np.ndarray) -> str:
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"got {got.dtype}{got.shape}, expected {want.dtype}{want.shape}"
    i = int(np.flatnonzero(got.astype(np.float64) != want.astype(np.float64))[0])
    return f"element {i} is {got[i]}, expected {want[i]}"


@engine_settings
@given(matrix=matrices())
def test_every_kind_op_and_dtype_matches_numpy(matrix):
    nranks, colls, seed = matrix
    note(f"nranks={nranks} seed={seed} colls={colls}")
    per_rank = pydfccl.launch(matrix_worker, nranks, args=(colls, seed), timeout=LAUNCH_TIMEOUT)
    for i, c in enumerate(colls):
        send_elems, _ = buffer_elems(c.kind, c.count, nranks)
        inputs = [values(seed, i, r, c, send_elems) for r in range(nranks)]
        for rank in range(nranks):
            want = reference(c.kind, inputs, c.op, c.root, rank)
            if want is None:
                continue            # reduce: only the root's output is defined
            got = per_rank[rank][i]
            assert _same(got, want), f"rank {rank}, collective {i} {c}: {_difference(got, want)}"
