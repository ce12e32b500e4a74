"""Which all_reduces run one-shot rather than on the ring: a host decision that every rank
makes alike from sizes they share (``start()`` compares them), and that the daemon reads
as the collective's table kind (``ONE_SHOT``). Its step plan is ``kernels/plans.py``'s.

A one-shot sender at distance k writes lane k-1 of the receiver's connector, a slice of
every slot; the input must fit one lane, and no more senders than a connector has lanes.
Plain Python: the launcher and the tools that predict what the engine does use it without
the kernels.
"""

from __future__ import annotations

import os

from .collectives import ONE_SHOT, collective
from .layout import CONN_LANES

__all__ = ["ONE_SHOT_BYTES", "lane_bytes", "one_shot_limit", "one_shot", "table_kind"]

# The largest all_reduce that runs one-shot: each rank reads every rank's input, n times
# the ring's reads, which costs less than the ring's chained hops only while messages are
# small. PYDFCCL_ONE_SHOT_BYTES sets it for a process and its rank processes (0: the ring
# always), so that a benchmark can measure both.
ONE_SHOT_BYTES = int(os.environ.get("PYDFCCL_ONE_SHOT_BYTES", 16 * 1024))


def lane_bytes(nranks: int, slot_bytes: int) -> int:
    """Bytes of each slot a one-shot sender has: the slot cut in ``nranks - 1`` lanes of
    16-byte multiples (``plans.device_lane_bytes`` is the daemon's)."""
    return slot_bytes // max(1, nranks - 1) // 16 * 16


def one_shot_limit(nranks: int, slot_bytes: int) -> int:
    """The largest all_reduce, in bytes, that runs one-shot on ``nranks`` ranks with slots
    of ``slot_bytes`` (0: none does)."""
    if not 2 <= nranks <= CONN_LANES + 1:
        return 0
    return min(ONE_SHOT_BYTES, lane_bytes(nranks, slot_bytes))


def one_shot(count: int, itemsize: int, nranks: int, slot_bytes: int) -> bool:
    """Whether an all_reduce of ``count`` elements runs one-shot."""
    return count * itemsize <= one_shot_limit(nranks, slot_bytes)


def table_kind(kind: str, count: int, itemsize: int, nranks: int, slot_bytes: int) -> int:
    """The kind the daemon's collective table records for a collective."""
    if kind == "all_reduce" and one_shot(count, itemsize, nranks, slot_bytes):
        return ONE_SHOT
    return collective(kind).code
