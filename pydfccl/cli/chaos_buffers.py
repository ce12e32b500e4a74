"""A rank's buffers for the chaos demo, filled and checked in bulk.

Every collective's send buffer is a view of one allocation and every receive buffer a view
of another, so that filling an iteration's inputs is one host-to-device copy and reading
its outputs one copy back, instead of two for each collective (each a pinned staging copy
and a stream wait on a GPU). The inputs of every rank are made at once as one numpy
expression over the whole allocation; the expected results (``protocol.reference``) are
computed from views of them, and the check compares the whole receive allocation at once.
The inputs repeat every ``PERIOD`` iterations, so each iteration's inputs and expected
outputs are computed once and reused. Views start at 256-byte boundaries, as separate
allocations would.
"""

from __future__ import annotations

import numpy as np

from ..protocol.codes import normalize_dtype
from ..protocol.collectives import split_output
from ..protocol.reference import reference

__all__ = ["ALIGN_BYTES", "PERIOD", "ChaosBuffers", "split_matrix"]

ALIGN_BYTES = 256
# Iteration it's inputs: (position + 7 * collective + 3 * it) mod PERIOD, plus rank + 1.
PERIOD = 13


def split_matrix(k: int, count: int, nranks: int) -> np.ndarray:
    """An all_to_allv's counts as collective ``k`` of the demo: ``[a][b]`` elements from
    rank a to rank b, ``(a + 2b + k) mod (count + 1)``: empty blocks and blocks of
    different sizes on the same run."""
    a, b = np.ogrid[:nranks, :nranks]
    return (a + 2 * b + k) % (count + 1)


def _layout(sizes: list[int], itemsize: int) -> tuple[list[int], int]:
    """Each size's offset (elements) in one allocation, every one 256-byte aligned, and the
    allocation's elements."""
    step = max(1, ALIGN_BYTES // itemsize)
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // step) * step
    return offsets, max(total, 1)


class ChaosBuffers:
    """The send and receive buffers of ``kinds`` (collective k of ``kinds[k]``, with
    ``sizes[k]`` = (send, recv) elements) for rank ``comm.rank``; ``splits[k]``: an
    all_to_allv's counts (``split_matrix``), whose ranks send buffers of their own sizes."""

    def __init__(self, comm, kinds: list[str], sizes: list[tuple[int, int]], dtype: str,
                 roots: list[int], splits: dict | None = None):
        self.comm, self.kinds, self.roots, self.dtype = comm, kinds, roots, dtype
        self.splits = splits or {}
        self._phase = 0
        itemsize = np.dtype(normalize_dtype(dtype)).itemsize
        self.send_at, send_total = _layout([s for s, _ in sizes], itemsize)
        self.recv_at, recv_total = _layout([r for _, r in sizes], itemsize)
        self.sizes = sizes
        self.send_all = comm.empty(send_total, dtype)
        self.recv_all = comm.empty(recv_total, dtype)
        self.sends = [self.send_all[o:o + s] for o, (s, _) in zip(self.send_at, sizes)]
        self.recvs = [self.recv_all[o:o + r] for o, (_, r) in zip(self.recv_at, sizes)]
        # each send element's position in its buffer and its collective, for the inputs
        self._pos = np.zeros(send_total, np.int64)
        self._coll = np.zeros(send_total, np.int64)
        for k, (o, (s, _)) in enumerate(zip(self.send_at, sizes)):
            self._pos[o:o + s] = np.arange(s)
            self._coll[o:o + s] = k
        self._ranks = np.arange(comm.nranks, dtype=np.int64)[:, None] + 1
        self._inputs = None
        self._inputs_of: dict = {}      # it % PERIOD -> every rank's inputs
        self._expected_of: dict = {}    # it % PERIOD -> (want, defined, outputs verified)

    def fill(self, it: int) -> None:
        """Make iteration ``it``'s inputs of every rank (small integers, so that every sum is
        exact in every dtype) and copy this rank's into its send buffers, in one copy."""
        phase = self._phase = it % PERIOD
        if phase not in self._inputs_of:
            base = (self._pos + 7 * self._coll + 3 * phase) % PERIOD
            self._inputs_of[phase] = (base[None, :] + self._ranks).astype(
                normalize_dtype(self.dtype))
        self._inputs = self._inputs_of[phase]
        self.send_all[...] = self._inputs[self.comm.rank]

    def inputs(self, k: int) -> list[np.ndarray]:
        """Collective ``k``'s inputs of every rank in this iteration (views), made as
        ``fill`` makes them: an all_to_allv's from each rank's own size."""
        if k in self.splits:
            base = 7 * k + 3 * self._phase
            return [((np.arange(int(row.sum())) + base) % PERIOD + r + 1).astype(
                normalize_dtype(self.dtype)) for r, row in enumerate(self.splits[k])]
        o, s = self.send_at[k], self.sizes[k][0]
        return list(self._inputs[:, o:o + s])

    def check(self, it: int) -> int:
        """Read every output back in one copy and compare it with numpy's reference; returns
        the outputs verified (a reduce's only at its root). AssertionError names the first
        wrong element."""
        got = np.asarray(self.recv_all)
        phase = it % PERIOD
        if phase not in self._expected_of:
            self._expected_of[phase] = self._expected(got)
        want, defined, verified = self._expected_of[phase]
        wrong = np.flatnonzero(defined & (got != want))
        if wrong.size:
            at = int(wrong[0])
            k = int(np.searchsorted(self.recv_at, at, side="right") - 1)
            bad = at - self.recv_at[k]
            raise AssertionError(f"iteration {it}, collective {k} ({self.kinds[k]}): element "
                                 f"{bad} is {got[at]}, expected {want[at]}")
        return verified

    def _expected(self, got: np.ndarray) -> tuple:
        """(expected receive allocation, shaped as ``got``; which of its elements are
        defined; outputs verified) for the inputs ``fill`` made last."""
        want = np.empty_like(got)
        defined = np.zeros(got.size, bool)
        verified = 0
        for k, kind in enumerate(self.kinds):
            out = (split_output(self.inputs(k), self.splits[k], self.comm.rank)
                   if k in self.splits else
                   reference(kind, self.inputs(k), "sum", self.roots[k], self.comm.rank))
            if out is None:
                continue        # reduce: only the root's output is defined
            o = self.recv_at[k]
            want[o:o + out.size] = out
            defined[o:o + out.size] = True
            verified += 1
        return want, defined, verified
