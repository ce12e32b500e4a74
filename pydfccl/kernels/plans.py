"""Every collective as a list of steps over the ring (rank r sends to r+1): the device side
of the kinds that protocol/collectives.py defines (codes, steps a loop, connector sets).

A loop moves at most one slot per step; a step is one primitive and one preemption point.
Counts follow NCCL: all_gather's ``count`` is the per-rank input, reduce_scatter's the
per-rank output, so their "chunk k" is rank k's block of ``count`` elements.

=================  ==========  ====================================================
kind               steps/loop  rank r, step s (n ranks)
=================  ==========  ====================================================
all_reduce         2n-1        ``ring.py``: reduce-scatter then all-gather
all_gather         n           s=0 copy own block out and send it; then recvCopySend
                               chunk r-s; the last step only receives
reduce_scatter     n           s=0 send chunk r-1; recvReduceSend chunk r-1-s; the
                               last step (chunk r) recvReduceCopy into the output
broadcast          1           a chain from the root: the root sends (and copies),
                               the middle ranks recvCopySend, root-1 receives
reduce             1           a chain ending at the root: root+1 sends, the middle
                               ranks recvReduceSend, the root recvReduceCopy
send, recv         1           point to point: send to ``peer`` (kept in ``root``), or
                               receive from it
all_to_all         2n-1        s=0 copy the own block; then for k=1..n-1 send block
                               r+k to rank r+k and receive block r-k from rank r-k,
                               through connector set k-1 (each set joins r to r+k)
all_to_allv        2n-1        all_to_all's steps over the run's blocks (``split_step``:
                               where each starts and how long it is, from the run's
                               row of counts); past a block's end a step moves nothing
one-shot           2           a small all_reduce (``protocol/one_shot.py``): s=0 send the input to
all_reduce                     every other rank; s=1 receive every rank's and reduce
                               them in rank order 0, 1, ..., n-1 (``F_ALL`` steps)
=================  ==========  ====================================================

Ring kinds send to rank r+1 and receive from r-1 through the collective's connector set;
``step_peers`` gives each step's (next, previous, connector set) for every kind.

A one-shot all_reduce takes one hop where the ring takes 2n-2 in a chain (14 for 8 ranks,
about 4 us each on the H200). It needs no more connectors than the ring: its sender at
distance k (rank r-k) writes lane k-1 of the receiver's connector, a slice of every slot
(``lane_bytes``) with its own tail and head words (``layout.CONN_LANES``), so the step
that waits for all of them waits on n-1 words of one connector. Every rank combines the
inputs in the same order, so every rank gets the same bits.
"""

from numba import cuda

from ..protocol.collectives import BY_NAME, ONE_SHOT, ONE_SHOT_STEPS
from .divide import quotient
from .memory import load_volatile
from .primitives import COPY, F_ALL, F_POSTDIV, F_RECV, F_SEND, F_USER_IN, F_USER_OUT
from .ring import chunk_span, ring_index, ring_step

__all__ = ["steps_per_loop", "loop_elems", "plan_step", "split_step", "step_peers",
           "loop_counted", "split_row_words", "SPLIT_HEADER_WORDS", "SPLIT_TRAILER_BYTES",
           "slot_payload", "ONE_SHOT", "device_lane_bytes"]

# The kinds' codes (protocol/collectives.py), named KIND_* apart from the primitives' verbs
# (primitives.SEND is a step that sends; KIND_SEND is a collective that is one send).
KIND_ALL_REDUCE, KIND_ALL_GATHER, KIND_REDUCE_SCATTER, KIND_BROADCAST, KIND_REDUCE, KIND_SEND, \
    KIND_RECV, KIND_ALL_TO_ALL, KIND_ALL_TO_ALLV = (BY_NAME[k].code for k in (
        "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send", "recv",
        "all_to_all", "all_to_allv"))
# A run of an all_to_allv hands the daemon, in place of its send buffer, a row of its
# counts in memory the daemon reads (``host/split_rows.py``): the send buffer's address
# and a pad word, then for each peer p (send count, send offset) to p, then for each p
# (recv count, recv offset) from p, in elements.
SPLIT_HEADER_WORDS = 2
# The last bytes of each slot an all_to_allv sends hold the part's length, which the
# receiver compares with its own: a pair whose counts differ is named, not misread.
SPLIT_TRAILER_BYTES = 16


def split_row_words(nranks: int) -> int:
    """Words of one run's row of counts on ``nranks`` ranks."""
    return SPLIT_HEADER_WORDS + 4 * nranks


COPY_SEND = F_USER_IN | F_SEND | F_USER_OUT
RECV_COPY_SEND = F_RECV | F_SEND | F_USER_OUT
RECV_ONLY = F_RECV | F_USER_OUT
SEND_ONLY = F_USER_IN | F_SEND
RECV_REDUCE_SEND = F_RECV | F_USER_IN | F_SEND
RECV_REDUCE_COPY = F_RECV | F_USER_IN | F_USER_OUT | F_POSTDIV
COPY_ONLY = F_USER_IN | F_USER_OUT     # a copy that no op divides
SEND_ALL = SEND_ONLY | F_ALL
RECV_REDUCE_ALL = RECV_REDUCE_COPY | F_ALL


@cuda.jit(device=True)
def device_lane_bytes(nranks, slot_bytes):
    """``protocol.one_shot.lane_bytes`` for thread 0, which needs it at every one-shot step
    (divide.py)."""
    return quotient(slot_bytes, max(1, nranks - 1)) // 16 * 16


@cuda.jit(device=True)
def steps_per_loop(kind, nranks):
    if kind == ONE_SHOT:
        return ONE_SHOT_STEPS
    if (nranks == 1 or kind == KIND_BROADCAST or kind == KIND_REDUCE or kind == KIND_SEND
            or kind == KIND_RECV):
        return 1
    if kind == KIND_ALL_REDUCE or loop_counted(kind):
        return 2 * nranks - 1
    return nranks


@cuda.jit(device=True)
def slot_payload(kind, slot_bytes, itemsize):
    """Elements a slot of ``kind`` carries: all its bytes, less an all_to_allv's trailer."""
    if kind == KIND_ALL_TO_ALLV:
        return (slot_bytes - SPLIT_TRAILER_BYTES) // itemsize
    return slot_bytes // itemsize


@cuda.jit(device=True)
def loop_counted(kind):
    """Whether ``kind``'s slot counters count loops (``Collective.loop_counted``): the
    all_to_alls, which send and receive once a loop on each of their connector sets."""
    return kind == KIND_ALL_TO_ALL or kind == KIND_ALL_TO_ALLV


@cuda.jit(device=True)
def step_peers(kind, rank, nranks, root, step):
    """(rank sent to, rank received from, connector set within the collective's)."""
    if kind == KIND_SEND or kind == KIND_RECV:
        return root, root, 0
    if loop_counted(kind) and step > 0:
        k = (step + 1) // 2
        return ring_index(rank + k, nranks), ring_index(rank - k + nranks, nranks), k - 1
    return ring_index(rank + 1, nranks), ring_index(rank - 1 + nranks, nranks), 0


@cuda.jit(device=True)
def loop_elems(kind, nranks, slot_elems):
    """Elements of a channel's range that one loop covers."""
    if kind == KIND_ALL_REDUCE:
        return nranks * slot_elems
    return slot_elems


@cuda.jit(device=True)
def plan_step(kind, rank, nranks, root, count, begin, end, loop, step, slot_elems):
    """(flags, input offset, output offset, length) of one step, offsets in elements."""
    if kind == KIND_ALL_REDUCE:
        chunk, flags = ring_step(rank, nranks, step)
        first, n = chunk_span(begin, end, loop, chunk, nranks, slot_elems)
        return flags, first, first, n
    first = begin + loop * slot_elems
    n = min(slot_elems, end - first)
    if kind == ONE_SHOT:        # one loop: the whole input fits a lane (``protocol.one_shot``)
        if step == 0:
            return SEND_ALL, first, first, n
        return RECV_REDUCE_ALL, first, first, n
    if kind == KIND_SEND:
        return SEND_ONLY, first, first, n
    if kind == KIND_RECV:
        return RECV_ONLY, first, first, n
    if kind == KIND_ALL_TO_ALL:    # ``count`` elements per peer; the block for rank j at j*count
        if step == 0:
            return COPY_ONLY, rank * count + first, rank * count + first, n
        k = (step + 1) // 2
        if step % 2 == 1:
            return SEND_ONLY, ring_index(rank + k, nranks) * count + first, 0, n
        return RECV_ONLY, 0, ring_index(rank - k + nranks, nranks) * count + first, n
    if nranks == 1:
        return COPY, first, first, n
    if kind == KIND_BROADCAST or kind == KIND_REDUCE:
        if kind == KIND_BROADCAST:
            position = ring_index(rank - root + nranks, nranks)    # the root is first
            flags = COPY_SEND if position == 0 else (
                RECV_ONLY if position == nranks - 1 else RECV_COPY_SEND)
        else:
            position = ring_index(rank - root - 1 + 2 * nranks, nranks)    # the root last
            flags = SEND_ONLY if position == 0 else (
                RECV_REDUCE_COPY if position == nranks - 1 else RECV_REDUCE_SEND)
        return flags, first, first, n
    if kind == KIND_ALL_GATHER:
        chunk = ring_index(rank - step + nranks, nranks)
        if step == 0:
            return COPY_SEND, first, chunk * count + first, n
        flags = RECV_ONLY if step == nranks - 1 else RECV_COPY_SEND
        return flags, first, chunk * count + first, n
    # reduce_scatter
    chunk = ring_index(rank - 1 - step + 2 * nranks, nranks)
    if step == 0:
        return SEND_ONLY, chunk * count + first, first, n
    flags = RECV_REDUCE_COPY if step == nranks - 1 else RECV_REDUCE_SEND
    return flags, chunk * count + first, first, n


@cuda.jit(device=True)
def split_step(row, rank, nranks, begin, end, loop, step, slot_elems):
    """``plan_step`` of an all_to_allv: all_to_all's step over the run's blocks, whose
    counts and offsets are in ``row`` (``SPLIT_HEADER_WORDS``). The channel covers
    [begin, end) of every block (the blocks' largest size split among channels); a block
    shorter than that leaves its steps empty from its end on."""
    first = begin + loop * slot_elems
    sends = row + SPLIT_HEADER_WORDS * 8
    recvs = sends + nranks * 16
    if step == 0:
        at = load_volatile(sends + rank * 16 + 8)
        to = load_volatile(recvs + rank * 16 + 8)
        return COPY_ONLY, at + first, to + first, _part(sends + rank * 16, first, end,
                                                        slot_elems)
    k = (step + 1) // 2
    if step % 2 == 1:
        pair = sends + ring_index(rank + k, nranks) * 16
        return SEND_ONLY, load_volatile(pair + 8) + first, 0, _part(pair, first, end,
                                                                    slot_elems)
    pair = recvs + ring_index(rank - k + nranks, nranks) * 16
    return RECV_ONLY, 0, load_volatile(pair + 8) + first, _part(pair, first, end, slot_elems)


@cuda.jit(device=True)
def _part(pair, first, end, slot_elems):
    """Elements in the slot of a loop that starts at ``first`` of the block whose
    (count, offset) is at ``pair``. Volatile loads: the host rewrites a row for a later
    run, which a cached line would hide."""
    return max(0, min(slot_elems, min(end, load_volatile(pair)) - first))
