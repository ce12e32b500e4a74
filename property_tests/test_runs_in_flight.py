"""Several runs of each collective in flight, in random per-rank interleavings, on the CUDA
simulator: every run's output exact, whatever the order.

Each rank submits every run of every collective before it waits for any. The k-th run of a
collective meets the k-th run of it on every rank, so a rank's order keeps each
collective's runs in sequence but interleaves the collectives at random, differently on
each rank. Up to ``RUNS_IN_FLIGHT`` runs of a collective go to the SQ at once (the daemon
queues them behind the active one on each block); more wait on the host. Every run has its
own buffers and inputs, so a run that read or wrote another run's buffers shows as a wrong
output. Each example is one launch of 2-3 rank processes (seconds): the budget is small and
fixed, with no shrinking, as in ``test_collective_matrix.py``.
"""

import os

import numpy as np
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import pydfccl
from pydfccl.protocol import layout as L
from pydfccl import platform
from pydfccl.protocol.reference import buffer_elems, reference

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")
LAUNCH_TIMEOUT = 240.0
EXAMPLES = 24 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 4
engine_settings = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                           phases=[Phase.explicit, Phase.reuse, Phase.generate],
                           suppress_health_check=[HealthCheck.too_slow])


def inputs(seed: int, coll: int, run: int, rank: int, elems: int) -> np.ndarray:
    rng = np.random.default_rng([seed, coll, run, rank])
    return rng.integers(-1000, 1001, elems).astype(np.int64)


def runs_worker(comm, colls, orders, seed):
    """Submit this rank's runs in its order (``orders[rank]``: collective indices, the k-th
    appearance of a collective being its k-th run), then wait for all; return every output
    by (collective, run)."""
    for i, (kind, count, root) in enumerate(colls):
        comm.prepare(i, kind, count=count, dtype="int64", root=root)
    comm.start()
    futures, taken = {}, [0] * len(colls)
    for i in orders[comm.rank]:
        kind, count, _ = colls[i]
        send_elems, recv_elems = buffer_elems(kind, count, comm.nranks)
        send = comm.empty(send_elems, "int64")
        platform.copy_in(send, inputs(seed, i, taken[i], comm.rank, send_elems))
        recv = comm.empty(recv_elems, "int64")
        platform.copy_in(recv, np.full(recv_elems, -7, np.int64))
        futures[(i, taken[i])] = (comm.run(i, send, recv), send)
        taken[i] += 1
    return {key: platform.to_numpy(f.result(timeout=200), "int64").copy()
            for key, (f, _) in futures.items()}


@st.composite
def interleavings(draw):
    """(nranks, collectives, per-rank orders, seed): 2-3 ranks, 1-3 collectives of 1 to
    RUNS_IN_FLIGHT + 2 runs each, every rank's runs in its own random interleaving. With 2
    channels of 128-byte slots, counts up to 120 int64 give each block a share and take
    several loops, so the blocks of a rank drift apart by whole runs."""
    nranks = draw(st.integers(2, 3))
    colls = draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 120),
                                    st.integers(0, nranks - 1)), min_size=1, max_size=3))
    runs = draw(st.lists(st.integers(1, L.RUNS_IN_FLIGHT + 2), min_size=len(colls),
                         max_size=len(colls)))
    sequence = [i for i, n in enumerate(runs) for _ in range(n)]
    orders = [draw(st.permutations(sequence)) for _ in range(nranks)]
    return nranks, colls, orders, draw(st.integers(0, 2**32 - 1))


@engine_settings
@given(case=interleavings())
def test_every_run_of_every_interleaving_is_exact(case):
    nranks, colls, orders, seed = case
    note(f"nranks={nranks} seed={seed} colls={colls} orders={orders}")
    per_rank = pydfccl.launch(runs_worker, nranks, args=(colls, orders, seed),
                              timeout=LAUNCH_TIMEOUT, nblocks=2, slot_bytes=128)
    for i, (kind, count, root) in enumerate(colls):
        send_elems, _ = buffer_elems(kind, count, nranks)
        for run in range(orders[0].count(i)):
            sent = [inputs(seed, i, run, r, send_elems) for r in range(nranks)]
            for rank in range(nranks):
                want = reference(kind, sent, "sum", root, rank)
                if want is None:
                    continue           # reduce: only the root's output is defined
                got = per_rank[rank][(i, run)]
                assert np.array_equal(got[:want.size], want), (
                    f"rank {rank}, collective {i} ({kind}, count {count}), run {run}")
