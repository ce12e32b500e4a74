"""Device-memory traffic of a collective, and the copy it is measured against (issue #5).

**The bytes.** :func:`rank_traffic` walks the step plan the daemon runs
(``kernels/plans.plan_step``, the same code, called as plain Python) over every channel, loop
and step of one rank's share of a collective, and counts one chunk read for each of the
step's ``F_RECV`` (the slot from the previous rank) and ``F_USER_IN`` (the input) and one
chunk written for each of ``F_SEND`` (the next rank's slot) and ``F_USER_OUT`` (the output).
:func:`hbm_bytes` adds it up over the ranks. When every rank is on one GPU, all of it is that
GPU's memory. For all_reduce, S bytes per rank on n ranks, it is (6n-4)S through the ring
(:func:`all_reduce_hbm_bytes`) and n(3n-1)S one-shot
(:func:`one_shot_hbm_bytes`; small messages, kernels/plans.py). These are the bytes the
algorithm moves through global memory. They are not DRAM traffic measured by a counter: a
slot that its reader takes soon after it was written, and any size that fits in the L2
cache, may be served by the L2.

**The copy.** :func:`copy_bandwidths` times ``cuMemcpyDtoDAsync`` of each size with CUDA
events and counts 2 bytes (read plus written) per byte copied. A short kernel holds the
stream while the host queues the timed copies, so the events time the copies back to back
and not the host's calls between them. It needs a GPU. Under the simulator, or with no GPU,
it returns None and claims nothing.
"""

from __future__ import annotations

import time
import types
from functools import lru_cache

from .. import platform
from ..protocol.codes import COLLECTIVE_KINDS
from ..protocol.collectives import collective
from ..protocol.one_shot import table_kind
from ..kernels.primitives import F_ALL, F_RECV, F_SEND, F_USER_IN, F_USER_OUT
from ..kernels.ring import channel_count
from ..host.world_config import machine_sizes

__all__ = ["rank_traffic", "hbm_bytes", "all_reduce_hbm_bytes", "one_shot_hbm_bytes",
           "copy_bandwidth",
           "copy_bandwidths", "host_function"]

_HOST: dict = {}


def host_function(fn):
    """The plain-Python body of the Numba device function ``fn``. Every device function it
    calls (found among its globals) is replaced by its own Python body, recursively. On a
    GPU a device function cannot be called from the host, and ``py_func`` alone would still
    call its callees' dispatchers."""
    py = getattr(fn, "py_func", fn)
    if py in _HOST:
        return _HOST[py]
    scope = dict(py.__globals__)
    host = types.FunctionType(py.__code__, scope, py.__name__, py.__defaults__, py.__closure__)
    _HOST[py] = host
    for name in py.__code__.co_names:
        value = scope.get(name)
        if value is not fn and hasattr(value, "py_func") and callable(value):
            scope[name] = host_function(value)
    return host


@lru_cache(maxsize=None)
def _plan():
    from ..kernels import plans, ring

    return (host_function(plans.plan_step), host_function(plans.steps_per_loop),
            host_function(plans.loop_elems), host_function(ring.channel_span))


def rank_traffic(kind: str, rank: int, nranks: int, count: int, itemsize: int = 4, *,
                 root: int = 0, nblocks: int | None = None, slot_bytes: int | None = None,
                 every_loop: bool = False) -> tuple[int, int]:
    """(bytes read, bytes written) in device memory by ``rank`` for one run of a collective
    of ``kind`` with ``count`` elements (``prepare``'s count) of ``itemsize`` bytes.

    ``nblocks`` and ``slot_bytes`` are the world's sizes (the defaults of a launch on this
    machine when omitted). They set how the daemon cuts the data into channels, loops and
    chunks (``Communicator._table_entry``, ``daemon._span``). Every loop of a channel but its
    last covers a whole loop and moves the same bytes, so only the first and the last are
    walked. ``every_loop=True`` walks them all, as a check."""
    plan_step, steps_per_loop, loop_elems, channel_span = _plan()
    nblocks, slot_bytes = machine_sizes(nranks, nblocks, slot_bytes)
    code = table_kind(kind, count, itemsize, nranks, slot_bytes)
    slot_elems = slot_bytes // itemsize
    loop_size = loop_elems(code, nranks, slot_elems)
    nchannels = channel_count(collective(kind).ring_loop, count, itemsize, nranks, nblocks,
                              slot_bytes)
    steps = steps_per_loop(code, nranks)

    def loop_bytes(begin, end, loop):
        reads = writes = 0
        for step in range(steps):
            flags, _, _, n = plan_step(code, rank, nranks, root, count, begin, end, loop, step,
                                       slot_elems)
            n = max(0, n)
            # a one-shot step sends its input to, or receives from, every other rank
            fan = nranks - 1 if flags & F_ALL else 1
            sent_input = flags & F_SEND and flags & F_USER_IN
            reads += n * ((fan if flags & F_RECV else 0)
                          + ((fan if sent_input else 1) if flags & F_USER_IN else 0))
            writes += n * ((fan if flags & F_SEND else 0) + (1 if flags & F_USER_OUT else 0))
        return reads, writes

    reads = writes = 0
    for channel in range(nchannels):
        begin, end = channel_span(count, nchannels, channel)
        nloops = -(-(end - begin) // loop_size)                     # as daemon._span
        if every_loop:
            walked = [(loop, 1) for loop in range(nloops)]
        elif nloops > 0:      # the last loop once, the first for all the others
            walked = [(nloops - 1, 1)] + ([(0, nloops - 1)] if nloops > 1 else [])
        else:                 # an empty channel: the daemon retires it at once
            walked = []
        for loop, times in walked:
            r, w = loop_bytes(begin, end, loop)
            reads += times * r
            writes += times * w
    return reads * itemsize, writes * itemsize


def hbm_bytes(kind: str, nranks: int, count: int, itemsize: int = 4, *, root: int = 0,
              nblocks: int | None = None, slot_bytes: int | None = None) -> int:
    """Bytes read plus written in device memory by all ``nranks`` ranks together for one run
    of a collective (a kind of ``COLLECTIVE_KINDS``; see :func:`rank_traffic`)."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"hbm_bytes counts a collective of every rank, not {kind!r} "
                         f"(choose from {COLLECTIVE_KINDS}; rank_traffic counts one rank)")
    return sum(sum(rank_traffic(kind, r, nranks, count, itemsize, root=root, nblocks=nblocks,
                                slot_bytes=slot_bytes)) for r in range(nranks))


def all_reduce_hbm_bytes(nbytes: int, nranks: int) -> int:
    """The closed form for all_reduce through slots: (6n-4)S over n ranks of S bytes each
    (over its 2(n-1) ring steps a rank reads and writes 6n-4 chunks of S/n in all). For
    n = 1 it is a copy, 2S, which the formula also gives."""
    return (6 * nranks - 4) * nbytes


def one_shot_hbm_bytes(nbytes: int, nranks: int) -> int:
    """The closed form for a one-shot all_reduce: n(3n-1)S over n ranks of S bytes each.
    A rank reads its input once for each of the n-1 peers and writes it to their lanes,
    then reads the n inputs and writes the output: (2n-1)S read, nS written."""
    return nranks * (3 * nranks - 1) * nbytes


# -- the copy --------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _hold_kernel():
    from numba import cuda

    from ..kernels.memory import now_ns

    @cuda.jit
    def hold(ns):
        start = now_ns()
        while now_ns() - start < ns:
            cuda.nanosleep(1000)

    return hold


def copy_bandwidths(sizes, *, reps: int | None = None, warmup: int = 2) -> dict | None:
    """GB/s of a device-to-device copy (``cuMemcpyDtoDAsync``) of each size in ``sizes``
    (bytes), as bytes read plus written (2 x size) over the time of one copy; None without a
    GPU (under the simulator, too: it has no device memory to time).

    Each size: ``warmup`` copies, then ``reps`` copies timed with CUDA events (by default
    enough for 64 MiB, 5 to 200). A kernel holds the stream while the host queues them,
    and the hold is doubled and the size timed again if the queueing outlasted it."""
    if not platform.gpu_available():
        return None
    import numpy as np
    from numba import cuda

    sizes = sorted({int(s) for s in sizes if int(s) > 0})
    if not sizes:
        return {}
    hold = _hold_kernel()
    src = cuda.device_array(sizes[-1], np.uint8)
    dst = cuda.device_array(sizes[-1], np.uint8)
    stream = cuda.stream()
    hold[1, 1, stream](np.int64(1000))     # compile and load it before anything is timed
    stream.synchronize()
    out = {}
    for nbytes in sizes:
        a, b = dst[:nbytes], src[:nbytes]
        n = reps or max(5, min(200, (64 << 20) // nbytes))
        for _ in range(warmup):
            a.copy_to_device(b, stream=stream)
        stream.synchronize()
        hold_ns = 2_000_000
        for _ in range(4):
            start, stop = cuda.event(timing=True), cuda.event(timing=True)
            hold[1, 1, stream](np.int64(hold_ns))
            t0 = time.perf_counter_ns()
            start.record(stream)
            for _ in range(n):
                a.copy_to_device(b, stream=stream)
            stop.record(stream)
            queued_ns = time.perf_counter_ns() - t0
            stop.synchronize()
            if queued_ns < hold_ns:
                break
            hold_ns = 2 * queued_ns
        seconds = start.elapsed_time(stop) / 1e3 / n
        out[nbytes] = 2 * nbytes / seconds / 1e9
    del src, dst
    return out


def copy_bandwidth(nbytes: int, **kwargs) -> float | None:
    """GB/s of a device-to-device copy of ``nbytes`` (read plus written); None without a
    GPU. See :func:`copy_bandwidths`."""
    got = copy_bandwidths([nbytes], **kwargs)
    return None if got is None else got[int(nbytes)]
