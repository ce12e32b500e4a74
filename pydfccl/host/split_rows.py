"""The per-run counts of an all_to_allv: checked on the host, then written to a row in
memory its daemon reads (mapped pinned memory on a GPU, host memory under the simulator).

A run names its row in place of its send buffer (the SQ entry's send word); the row holds
the send buffer's address, then each peer's (count, offset) sent to it and received from
it (``kernels.plans.split_step``). A row belongs to its run until the run completes, and
rows are reused oldest first, so a row the daemon read is rewritten as late as possible.
"""

from __future__ import annotations

import collections
import operator
import threading

import numpy as np

from ..kernels.plans import split_row_words
from ..platform import HostBuffer

__all__ = ["SplitRows", "split_counts"]

CHUNK_ROWS = 64       # rows allocated at a time: a handful of runs in flight need one chunk


def split_counts(spec, nranks: int, rank: int, send_counts, recv_counts):
    """(send counts, recv counts) of a run of ``spec`` as lists of ints, or ValueError
    naming what is wrong: one count per rank, none negative or above the prepared count,
    and what a rank sends itself is what it receives from itself."""
    where = f"collective {spec.coll_id} ({spec.kind})"
    if not spec.per_peer_counts:
        raise ValueError(f"{where}: send_counts and recv_counts are for all_to_allv")
    lists = []
    for name, counts in (("send_counts", send_counts), ("recv_counts", recv_counts)):
        if counts is None:
            raise ValueError(f"{where}: each run needs {name}=, one count per rank")
        try:
            values = [operator.index(c) for c in counts]
        except TypeError:
            raise TypeError(f"{where}: {name} must be integers, got {counts!r}") from None
        if len(values) != nranks:
            raise ValueError(f"{where}: {name} has {len(values)} entries, needs one per rank "
                             f"({nranks})")
        bad = [c for c in values if not 0 <= c <= spec.count]
        if bad:
            raise ValueError(f"{where}: {name} {values} has {bad[0]}, outside 0..{spec.count} "
                             f"(the prepared count is the most one rank sends one rank)")
        lists.append(values)
    sends, recvs = lists
    if sends[rank] != recvs[rank]:
        raise ValueError(f"{where}: rank {rank} sends itself {sends[rank]} elements "
                         f"(send_counts[{rank}]) but receives {recvs[rank]} from itself "
                         f"(recv_counts[{rank}])")
    return sends, recvs


class SplitRows:
    """Rows of counts for the runs of one communicator's all_to_allvs on ``nranks`` ranks
    (none allocated before the first). ``take`` writes a run's row and returns its address;
    the row is free again once the run's future is done."""

    def __init__(self, nranks: int):
        self._nranks = nranks
        self._words = -(-split_row_words(nranks) // 2) * 2     # rows 16-byte aligned
        self._chunks = []            # the buffers, kept while the communicator lives
        self._free: collections.deque = collections.deque()
        self._rows: dict[int, np.ndarray] = {}    # address -> the row's int64 view
        self._lock = threading.Lock()

    def take(self, send_addr: int, counts: tuple, future) -> int:
        """The row of a run whose send buffer is at ``send_addr`` and whose (send, recv)
        counts are ``counts``, held until ``future`` is done."""
        with self._lock:
            if not self._free:
                self._grow()
            addr = self._free.popleft()
        row, n = self._rows[addr], self._nranks
        row[0], row[1] = send_addr, 0
        pairs = row[2:2 + 4 * n].reshape(2, n, 2)
        for side, sizes in enumerate(counts):
            pairs[side, :, 0] = sizes
            pairs[side, :, 1] = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        future.add_done_callback(lambda _: self._give(addr))
        return addr

    def _give(self, addr: int) -> None:
        with self._lock:
            self._free.append(addr)

    def _grow(self) -> None:
        row_bytes = self._words * 8
        chunk = HostBuffer(CHUNK_ROWS * row_bytes + 16)
        base = -chunk.addr % 16          # the first 16-byte aligned byte
        words = chunk.array[base:base + CHUNK_ROWS * row_bytes].view(np.int64)
        for k in range(CHUNK_ROWS):
            addr = chunk.addr + base + k * row_bytes
            self._rows[addr] = words[k * self._words:(k + 1) * self._words]
            self._free.append(addr)
        self._chunks.append(chunk)
