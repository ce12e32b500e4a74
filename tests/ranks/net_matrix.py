"""A rank of ``test_net.py``'s collectives matrix, run under mpiexec: every kind, op and a
spread of dtypes (a one-shot all_reduce, point-to-point transfers and an all_to_allv across
the emulated nodes among them), submitted in an order rotated by rank, each rank's outputs checked
against numpy. It prints one line a rank: how many outputs matched, the pairs by transport
and the proxy's message counts."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pydfccl  # noqa: E402
from pydfccl import platform  # noqa: E402
from pydfccl.protocol.reference import buffer_elems  # noqa: E402
from pydfccl.protocol.collectives import split_output  # noqa: E402
from shared_workers import expected_collective, fill, rank_inputs  # noqa: E402
from split_workers import count_matrix, run_input  # noqa: E402

CASES = [  # (kind, count, dtype, op, root)
    ("all_reduce", 90, "float64", "sum", 0), ("all_reduce", 70, "int32", "prod", 0),
    ("all_reduce", 65, "float32", "max", 0), ("all_reduce", 33, "int8", "min", 0),
    ("all_reduce", 129, "float16", "avg", 0), ("all_reduce", 12, "float32", "sum", 0),
    ("all_reduce", 300, "bfloat16", "sum", 0),
    ("all_gather", 1, "float32", "sum", 0), ("all_gather", 100, "int64", "sum", 0),
    ("reduce_scatter", 77, "int32", "max", 0), ("reduce_scatter", 65, "float32", "avg", 0),
    ("reduce_scatter", 130, "bfloat16", "sum", 0),
    ("broadcast", 1, "int8", "sum", 0), ("broadcast", 150, "float32", "sum", 3),
    ("reduce", 3, "uint8", "min", 1), ("reduce", 129, "int64", "prod", 2),
    ("reduce", 70, "float16", "avg", 3),
    ("all_to_all", 1, "int32", "sum", 0), ("all_to_all", 70, "float32", "avg", 0),
]
P2P = 100        # transfers: coll_id P2P + r is rank r's send to r + half, its peer's recv
SPLIT, SPLIT_COUNT = 99, 40   # an all_to_allv, its blocks drawn as split_workers draws them


def worker(comm):
    n, half = comm.nranks, comm.nranks // 2
    for i, (kind, count, dtype, op, root) in enumerate(CASES):
        comm.prepare(i, kind, count=count, dtype=dtype, op=op, root=root % n)
    to, frm = (comm.rank + half) % n, (comm.rank - half) % n
    comm.prepare(P2P + comm.rank, "send", count=40, dtype="int64", peer=to)
    comm.prepare(P2P + frm, "recv", count=40, dtype="int64", peer=frm)
    comm.prepare(SPLIT, "all_to_allv", count=SPLIT_COUNT, dtype="int32")
    comm.start()
    counts = count_matrix(n, SPLIT_COUNT, 0)
    split_in = comm.empty(int(counts[comm.rank].sum()), "int32")
    split_in[...] = run_input(comm.rank, 0, split_in.size)
    split = comm.run(SPLIT, split_in, comm.empty(int(counts[:, comm.rank].sum()), "int32"),
                     send_counts=counts[comm.rank].tolist(),
                     recv_counts=counts[:, comm.rank].tolist())
    order = list(range(len(CASES)))
    order = order[comm.rank:] + order[:comm.rank]
    futures = {}
    for i in order:
        kind, count, dtype, op, root = CASES[i]
        send_elems, recv_elems = buffer_elems(kind, count, n)
        send = fill(comm, rank_inputs(comm.rank, send_elems, dtype, i))
        recv = fill(comm, np.full(recv_elems, 99, dtype))
        futures[i] = comm.run(i, send, recv)
    sent = comm.run(P2P + comm.rank, fill(comm, np.arange(40, dtype=np.int64) + comm.rank))
    got = comm.run(P2P + frm, fill(comm, np.zeros(40, np.int64)))
    sent.result(timeout=300)
    matched = 0
    for i, (kind, count, dtype, op, root) in enumerate(CASES):
        out = np.array(platform.to_numpy(futures[i].result(timeout=300), dtype))
        want = expected_collective(kind, n, comm.rank, count, dtype, op, root % n, i)
        if want is None:
            continue
        assert np.array_equal(out, want), f"rank {comm.rank}: {CASES[i]}: {out} != {want}"
        matched += 1
    transfer = platform.to_numpy(got.result(timeout=300), "int64")
    assert np.array_equal(transfer, np.arange(40, dtype=np.int64) + frm), transfer
    matched += 1
    inputs = [run_input(r, 0, int(counts[r].sum())) for r in range(n)]
    assert np.asarray(split.result(timeout=300)).tolist() == split_output(
        inputs, counts, comm.rank).tolist()
    matched += 1
    return dict(rank=comm.rank, matched=matched, transports=comm.world.transports(),
                net=None if comm.world.net is None else comm.world.net.stats)


if __name__ == "__main__":
    from mpi4py import MPI

    with pydfccl.Communicator.from_mpi(MPI.COMM_WORLD, max_colls=32) as comm:
        result = worker(comm)
    print("RESULT " + json.dumps(result), flush=True)
