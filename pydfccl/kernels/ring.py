"""Ring all-reduce as a list of steps: reduce-scatter, then all-gather.

One loop moves ``nranks`` chunks of at most one slot each around the ring (rank r sends to
r+1 and receives from r-1). For rank r the loop is, as in NCCL's ``all_reduce.h``::

    step 0            send              chunk r-1      (my input, to start the reduction)
    steps 1..n-2      recvReduceSend    chunk r-1-s    (add mine, pass on)
    step n-1          recvReduceCopySend chunk r       (fully reduced: keep it, pass it on)
    steps n..2n-3     recvCopySend      chunk r-s+n-1  (keep, pass on)
    step 2n-2         recv              chunk r+1      (keep)

Each step is one primitive and one preemption point: the saved context is (loop, step).
"""

from numba import cuda

from .divide import quotient
from .primitives import (COPY, RECV, RECV_COPY_SEND, RECV_REDUCE_COPY_SEND,
                         RECV_REDUCE_SEND, SEND)

__all__ = ["ring_index", "ring_step", "chunk_span", "channel_span", "channel_count",
           "MIN_CHANNEL_CHUNK"]

# A collective takes another channel (daemon block) only while each channel's steps still
# move at least this many bytes, or a whole slot when slots are smaller. Channels counted
# in whole loops (a slot per chunk) left a world of large slots with few busy blocks at
# middle sizes: 16 MiB on 4 ranks with 32 blocks of 512 KiB slots took 8 of the 32, each
# moving 512 KiB a step. With all 32, 8 MiB took 113 us instead of 3,100 on an H200.
MIN_CHANNEL_CHUNK = 64 * 1024


@cuda.jit(device=True)
def ring_index(x, n):
    """``x % n`` for 0 <= x < 3n, without a division: thread 0 plans every step, and a
    64-bit division by a runtime value takes about 0.1 us on an H200."""
    if x >= n:
        x -= n
    if x >= n:
        x -= n
    return x


@cuda.jit(device=True)
def ring_step(rank, nranks, step):
    """(chunk index, primitive flags) of ``step`` of a loop, for ``rank``."""
    if nranks == 1:
        return 0, COPY
    if step == 0:
        return ring_index(rank - 1 + nranks, nranks), SEND
    if step < nranks - 1:
        return ring_index(rank - 1 - step + 2 * nranks, nranks), RECV_REDUCE_SEND
    chunk = ring_index(rank - (step - nranks + 1) + 2 * nranks, nranks)
    if step == nranks - 1:
        return chunk, RECV_REDUCE_COPY_SEND
    if step == 2 * nranks - 2:
        return chunk, RECV
    return chunk, RECV_COPY_SEND


def channel_count(ring_loop: bool, count: int, itemsize: int, nranks: int, nblocks: int,
                  slot_bytes: int) -> int:
    """How many channels a collective of ``count`` elements uses (host side: the table's
    ``nchannels``, which ``daemon._span`` reads). A ``ring_loop`` kind's channel
    (``protocol.collectives``: all_reduce's) holds ``nranks`` chunks a loop, other kinds'
    one."""
    chunk_elems = min(slot_bytes, MIN_CHANNEL_CHUNK) // itemsize
    least = chunk_elems * (nranks if ring_loop else 1)
    return max(1, min(nblocks, -(-count // least)))


@cuda.jit(device=True)
def channel_span(count, nchannels, channel):
    """[begin, end) of the elements one channel (daemon block) handles."""
    per = (count + nchannels - 1) // nchannels
    begin = min(count, channel * per)
    return begin, min(count, begin + per)


@cuda.jit(device=True)
def chunk_span(begin, end, loop, chunk, nranks, slot_elems):
    """(first element, length) of ``chunk`` in ``loop`` of the channel [begin, end)."""
    loop_size = nranks * slot_elems
    offset = begin + loop * loop_size
    remaining = min(loop_size, end - offset)
    chunk_size = quotient(remaining + nranks - 1, nranks)
    first = offset + chunk * chunk_size
    length = min(chunk_size, offset + remaining - first)
    if length < 0:
        length = 0
    return first, length
