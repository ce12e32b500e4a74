"""What each collective must produce, computed with numpy: the demo and the tests check
the daemon against it.

Floats are reduced the way the engine reduces them, so results compare exactly, not within
a tolerance: element by element in the ring's order (each element's partial result starts
at one rank and travels round the ring, every rank combining its own value into it: see
``ring_order``; a small all_reduce runs one-shot, in rank order), each step in the element
type's arithmetic. float16 and bfloat16 compute
every step in float32 and round the result back (round to nearest even), as NCCL and the
daemon do; ``avg`` divides the sum by the rank count the same way. Integers are reduced in
int64 and cast back, which wraps sums and products as the device does at every step (``avg``
agrees while the sum fits the type). Inputs are assumed free of NaN (max and min of a NaN are
not specified).
"""

from __future__ import annotations

import numpy as np

from .collectives import collective

__all__ = ["buffer_elems", "ring_order", "reference"]

_REDUCE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
           "min": np.minimum}


def buffer_elems(kind: str, count: int, nranks: int) -> tuple[int, int]:
    """(send, recv) elements a run needs, with NCCL's meaning of ``count``."""
    return collective(kind).buffers(count, nranks)


def ring_order(kind: str, elems: int, nranks: int, root: int = 0, *, itemsize: int = 4,
               nblocks: int | None = None, slot_bytes: int | None = None) -> np.ndarray:
    """For each of the ``elems`` send-buffer elements of a reduction, the rank whose value
    starts its partial result; ranks first+1, first+2, ... (mod ``nranks``) combine theirs
    into it in turn (kernels/plans.py and kernels/ring.py).

    reduce: the chain starts at root+1. reduce_scatter: output block c is reduced from rank
    c+1 round to rank c. all_reduce: each loop of each channel cuts its range into
    ``nranks`` chunks, and chunk c is reduced from rank c+1 round to rank c, so the order
    depends on the sizes the engine was given (``nblocks``, ``slot_bytes``; when omitted,
    those a launch on this machine uses by default: the simulator's on a machine without a
    GPU). A small all_reduce runs one-shot (kernels/plans.py): every element starts at rank
    0."""
    if kind == "reduce":
        return np.full(elems, (root + 1) % nranks, np.int64)
    if kind == "reduce_scatter":
        return (np.arange(elems) // (elems // nranks) + 1) % nranks
    if kind != "all_reduce":
        raise ValueError(f"{kind!r} does not reduce")
    from .one_shot import one_shot
    from ..kernels.ring import channel_count
    from ..host.world_config import machine_sizes

    nblocks, slot_bytes = machine_sizes(nranks, nblocks, slot_bytes)

    if one_shot(elems, itemsize, nranks, slot_bytes):   # every rank's in rank order
        return np.zeros(elems, np.int64)
    loop_size = (slot_bytes // itemsize) * nranks
    nchannels = channel_count(collective(kind).ring_loop, elems, itemsize, nranks, nblocks,
                              slot_bytes)
    per_channel = -(-elems // nchannels)                          # ring.channel_span
    i = np.arange(elems)
    begin = i // per_channel * per_channel
    end = np.minimum(elems, begin + per_channel)
    loop_begin = begin + (i - begin) // loop_size * loop_size     # ring.chunk_span
    chunk_size = -(-np.minimum(loop_size, end - loop_begin) // nranks)
    return ((i - loop_begin) // chunk_size + 1) % nranks


def _reduce(inputs, op: str, first: np.ndarray) -> np.ndarray:
    dtype = inputs[0].dtype
    n = len(inputs)
    if np.issubdtype(dtype, np.integer):
        out = inputs[0].astype(np.int64)
        for x in inputs[1:]:
            out = _REDUCE[op](out, x.astype(np.int64))
        if op == "avg":     # truncated toward zero, as C's (and NCCL's) division
            out = np.where(out < 0, -(-out // n), out // n)
        return out.astype(dtype)
    compute = np.float64 if dtype == np.float64 else np.float32
    values = np.stack(inputs)
    elems = np.arange(values.shape[1])
    out = values[first, elems]
    for k in range(1, n):
        x = values[(first + k) % n, elems]
        out = _REDUCE[op](out.astype(compute), x.astype(compute)).astype(dtype)
    if op == "avg":
        out = (out.astype(compute) / compute(n)).astype(dtype)
    return out


def reference(kind: str, inputs: list, op: str = "sum", root: int = 0,
              rank: int = 0, *, nblocks: int | None = None,
              slot_bytes: int | None = None) -> np.ndarray | None:
    """Rank ``rank``'s expected output, given every rank's send buffer (``inputs[r]``);
    None where NCCL leaves it unspecified (reduce on a non-root rank) or there is no output
    (send). For send and recv ``root`` is the peer: a recv gets its sender's buffer.
    ``nblocks`` and ``slot_bytes``: the engine's sizes, which fix an all_reduce's order
    (``ring_order``)."""
    dtype = inputs[0].dtype

    def reduced():
        first = ring_order(kind, inputs[0].size, len(inputs), root, itemsize=dtype.itemsize,
                           nblocks=nblocks, slot_bytes=slot_bytes)
        return _reduce(inputs, op, first)

    output = collective(kind).output
    if output is None:
        raise ValueError(f"{kind}'s output follows every rank's counts of the run: use "
                         "pydfccl.protocol.collectives.split_output")
    return output(inputs, rank, root, reduced)
