"""Every collective as a list of steps over the ring (rank r sends to r+1).

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
=================  ==========  ====================================================

Ring kinds send to rank r+1 and receive from r-1 through the collective's connector set;
``step_peers`` gives each step's (next, previous, connector set) for every kind.
"""

from numba import cuda

from ..codes import KINDS
from .primitives import COPY, F_POSTDIV, F_RECV, F_SEND, F_USER_IN, F_USER_OUT
from .ring import chunk_span, ring_step

__all__ = ["steps_per_loop", "loop_elems", "plan_step", "step_peers", "connector_sets"]

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, BROADCAST, REDUCE, SEND, RECV, ALL_TO_ALL = (
    KINDS[k] for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce",
                       "send", "recv", "all_to_all"))

COPY_SEND = F_USER_IN | F_SEND | F_USER_OUT
RECV_COPY_SEND = F_RECV | F_SEND | F_USER_OUT
RECV_ONLY = F_RECV | F_USER_OUT
SEND_ONLY = F_USER_IN | F_SEND
RECV_REDUCE_SEND = F_RECV | F_USER_IN | F_SEND
RECV_REDUCE_COPY = F_RECV | F_USER_IN | F_USER_OUT | F_POSTDIV
COPY_ONLY = F_USER_IN | F_USER_OUT     # a copy that no op divides


@cuda.jit(device=True)
def steps_per_loop(kind, nranks):
    if nranks == 1 or kind == BROADCAST or kind == REDUCE or kind == SEND or kind == RECV:
        return 1
    if kind == ALL_REDUCE or kind == ALL_TO_ALL:
        return 2 * nranks - 1
    return nranks


def connector_sets(kind: int, nranks: int) -> int:
    """Connector sets a collective of ``kind`` uses (host side: assigns them at start)."""
    return max(1, nranks - 1) if kind == ALL_TO_ALL else 1


@cuda.jit(device=True)
def step_peers(kind, rank, nranks, root, step):
    """(rank sent to, rank received from, connector set within the collective's)."""
    if kind == SEND or kind == RECV:
        return root, root, 0
    if kind == ALL_TO_ALL and step > 0:
        k = (step + 1) // 2
        return (rank + k) % nranks, (rank - k + nranks) % nranks, k - 1
    return (rank + 1) % nranks, (rank - 1 + nranks) % nranks, 0


@cuda.jit(device=True)
def loop_elems(kind, nranks, slot_elems):
    """Elements of a channel's range that one loop covers."""
    if kind == ALL_REDUCE:
        return nranks * slot_elems
    return slot_elems


@cuda.jit(device=True)
def plan_step(kind, rank, nranks, root, count, begin, end, loop, step, slot_elems):
    """(flags, input offset, output offset, length) of one step, offsets in elements."""
    if kind == ALL_REDUCE:
        chunk, flags = ring_step(rank, nranks, step)
        first, n = chunk_span(begin, end, loop, chunk, nranks, slot_elems)
        return flags, first, first, n
    first = begin + loop * slot_elems
    n = min(slot_elems, end - first)
    if kind == SEND:
        return SEND_ONLY, first, first, n
    if kind == RECV:
        return RECV_ONLY, first, first, n
    if kind == ALL_TO_ALL:      # ``count`` elements per peer; the block for rank j at j*count
        if step == 0:
            return COPY_ONLY, rank * count + first, rank * count + first, n
        k = (step + 1) // 2
        if step % 2 == 1:
            return SEND_ONLY, ((rank + k) % nranks) * count + first, 0, n
        return RECV_ONLY, 0, ((rank - k + nranks) % nranks) * count + first, n
    if nranks == 1:
        return COPY, first, first, n
    if kind == BROADCAST or kind == REDUCE:
        if kind == BROADCAST:
            position = (rank - root + nranks) % nranks          # the root is first
            flags = COPY_SEND if position == 0 else (
                RECV_ONLY if position == nranks - 1 else RECV_COPY_SEND)
        else:
            position = (rank - root - 1 + 2 * nranks) % nranks  # the root is last
            flags = SEND_ONLY if position == 0 else (
                RECV_REDUCE_COPY if position == nranks - 1 else RECV_REDUCE_SEND)
        return flags, first, first, n
    if kind == ALL_GATHER:
        chunk = (rank - step + nranks) % nranks
        if step == 0:
            return COPY_SEND, first, chunk * count + first, n
        flags = RECV_ONLY if step == nranks - 1 else RECV_COPY_SEND
        return flags, first, chunk * count + first, n
    # REDUCE_SCATTER
    chunk = (rank - 1 - step + 2 * nranks) % nranks
    if step == 0:
        return SEND_ONLY, chunk * count + first, first, n
    flags = RECV_REDUCE_COPY if step == nranks - 1 else RECV_REDUCE_SEND
    return flags, chunk * count + first, first, n
