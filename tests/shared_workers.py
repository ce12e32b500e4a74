"""The inputs each rank fills, the results expected from them, and the rank worker that runs
a list of collective cases: shared by the tests of ``tests/kernels`` and ``tests/ranks``.

A module, not a fixture, because ``pydfccl.launch`` spawns rank processes that import the
worker functions by name (``tests/`` is on their path, from ``tests/conftest.py``). Each
worker returns plain data (lists, dicts) so that results cross process boundaries."""

import collections

import numpy as np

from pydfccl import platform
from pydfccl.protocol.reference import buffer_elems, reference

__all__ = ["fill", "rank_inputs", "expected", "expected_collective", "collective_cases",
           "traced_collective_cases"]


def fill(comm, values: np.ndarray):
    buf = comm.empty(values.size, values.dtype)
    platform.copy_in(buf, values)
    return buf


def rank_inputs(rank: int, count: int, dtype, salt: int) -> np.ndarray:
    """Small integers so every reduction is exact in every dtype (prod stays tiny too);
    float16 and bfloat16 get values in [-4, 4) with more bits than they hold, so that their
    sums round at every ring step and only a reference in the ring's order matches."""
    if np.dtype(dtype).name in ("float16", "bfloat16"):
        return np.random.default_rng([salt, rank]).uniform(-4, 4, count).astype(dtype)
    base = (np.arange(count) * 7 + salt * 3 + rank) % 5
    return (base + (1 if np.issubdtype(np.dtype(dtype), np.integer) else 0.5)).astype(dtype)


def expected(nranks: int, count: int, dtype, op: str, salt: int) -> np.ndarray:
    return reference("all_reduce", [rank_inputs(r, count, dtype, salt) for r in range(nranks)], op)


def expected_collective(kind, nranks, rank, count, dtype, op, root, salt, **sizes):
    """numpy's answer for one rank (None where the rank's output is unspecified); ``sizes``:
    the launch's nblocks and slot_bytes, which fix an all_reduce's order."""
    send_elems, _ = buffer_elems(kind, count, nranks)
    inputs = [rank_inputs(r, send_elems, dtype, salt) for r in range(nranks)]
    return reference(kind, inputs, op, root, rank, **sizes)


def collective_cases(comm, cases, rotate=False):
    """Prepare one collective per (kind, count, dtype, op, root) case and run them all, in
    an order rotated by rank when ``rotate`` (so that tasks get preempted), returning each
    rank's output as a list."""
    for i, (kind, count, dtype, op, root) in enumerate(cases):
        comm.prepare(i, kind, count=count, dtype=dtype, op=op, root=root)
    comm.start()
    futures = {}
    order = list(range(len(cases)))
    if rotate:
        order = order[comm.rank % len(order):] + order[:comm.rank % len(order)]
    for i in order:
        kind, count, dtype, op, root = cases[i]
        send_elems, recv_elems = buffer_elems(kind, count, comm.nranks)
        send = fill(comm, rank_inputs(comm.rank, send_elems, dtype, i))
        recv = fill(comm, np.full(recv_elems, 99, dtype))    # poison: every element is written
        futures[i] = comm.run(i, send, recv)
    return [platform.to_numpy(futures[i].result(timeout=120), cases[i][2]).tolist()
            for i in range(len(cases))]


def traced_collective_cases(comm, cases):
    """collective_cases in rotated orders, with the primitives each case's tasks were
    preempted in (the daemon's event log)."""
    results = collective_cases(comm, cases, rotate=True)
    preempted_in = collections.defaultdict(set)
    for e in comm.trace():
        if e["event"] == "preempted":
            preempted_in[e["coll"]].add(e["primitive"])
    return dict(results=results, stats=comm.stats(),
                preempted_in={i: sorted(p) for i, p in preempted_in.items()})
