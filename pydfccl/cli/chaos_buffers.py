"""A rank's buffers for the chaos demo, made once and checked in bulk.

The inputs repeat every ``PERIOD`` iterations, so each of the ``PERIOD`` input patterns is
written to the device once, into a set of send buffers of its own, all in one copy when the
buffers are made, and an iteration runs on the set of its pattern: no input copy at all in
the timed iterations. Outputs go to ``batch`` sets of receive buffers in turn, and every
``batch`` iterations (and after the last) all of them are read back in one copy and
compared at once with the outputs of each pattern (``protocol.reference``), computed when
the buffers are made, before the timed iterations. numpy lets go of the GIL in a step over
a large array, and among rank threads of one process taking it back can cost more than the
step, so a check is a few whole-array steps, not a few per collective. Within a set, every
collective's buffer is a view of one allocation, starting at a 256-byte boundary as
separate allocations would.

A collective that wrote nothing leaves the outputs of ``batch`` iterations before in place,
and ``batch`` < ``PERIOD`` makes those another pattern's: the check refuses them. Sets that
would take more than ``SET_BYTES`` of device memory are fewer: one set of inputs, written
every iteration, and as many output sets as fit (at least one, checked every iteration).
"""

from __future__ import annotations

import numpy as np

from ..protocol.codes import normalize_dtype
from ..protocol.collectives import split_output
from ..protocol.reference import reference

__all__ = ["ALIGN_BYTES", "PERIOD", "SET_BYTES", "ChaosBuffers", "split_matrix"]

ALIGN_BYTES = 256
# Iteration it's inputs: (position + 7 * collective + 3 * it) mod PERIOD, plus rank + 1.
PERIOD = 13
SET_BYTES = 64 << 20      # device memory a rank's input sets, and its output sets, may take


def split_matrix(k: int, count: int, nranks: int) -> np.ndarray:
    """An all_to_allv's counts as collective ``k`` of the demo: ``[a][b]`` elements from
    rank a to rank b, ``(a + 2b + k) mod (count + 1)``: empty blocks and blocks of
    different sizes on the same run."""
    a, b = np.ogrid[:nranks, :nranks]
    return (a + 2 * b + k) % (count + 1)


def _layout(sizes: list[int], itemsize: int) -> tuple[list[int], int]:
    """Each size's offset (elements) in one allocation, every one 256-byte aligned, and the
    allocation's elements (a multiple of 256 bytes, so that sets laid end to end stay
    aligned)."""
    step = max(1, ALIGN_BYTES // itemsize)
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // step) * step
    return offsets, max(total, step)


class ChaosBuffers:
    """The send and receive buffers of ``kinds`` (collective k of ``kinds[k]``, with
    ``sizes[k]`` = (send, recv) elements) for rank ``comm.rank``; ``splits[k]``: an
    all_to_allv's counts (``split_matrix``), whose ranks send buffers of their own sizes.

    Each iteration: ``fill(it)``, run collective k from ``sends(it)[k]`` into
    ``recvs(it)[k]``, then ``check(it, last)``."""

    def __init__(self, comm, kinds: list[str], sizes: list[tuple[int, int]], dtype: str,
                 roots: list[int], splits: dict | None = None, set_bytes: int = SET_BYTES):
        self.comm, self.kinds, self.roots = comm, kinds, roots
        self.splits = splits or {}
        self.sizes = sizes
        self._host_dtype = normalize_dtype(dtype)
        itemsize = self._host_dtype.itemsize
        self.send_at, send_total = _layout([s for s, _ in sizes], itemsize)
        self.recv_at, self._recv_total = _layout([r for _, r in sizes], itemsize)
        self.input_sets = PERIOD if PERIOD * send_total * itemsize <= set_bytes else 1
        self.batch = max(1, min(PERIOD - 1, set_bytes // (self._recv_total * itemsize)))
        self.send_all = comm.empty(self.input_sets * send_total, dtype)
        self.recv_all = comm.empty(self.batch * self._recv_total, dtype)
        self._sends = [[self.send_all[i * send_total + o:i * send_total + o + s]
                        for o, (s, _) in zip(self.send_at, sizes)]
                       for i in range(self.input_sets)]
        self._recvs = [[self.recv_all[j * self._recv_total + o:j * self._recv_total + o + r]
                        for o, (_, r) in zip(self.recv_at, sizes)] for j in range(self.batch)]
        # each send element's position in its buffer and its collective, for the inputs
        self._pos = np.zeros(send_total, np.int64)
        self._coll = np.zeros(send_total, np.int64)
        for k, (o, (s, _)) in enumerate(zip(self.send_at, sizes)):
            self._pos[o:o + s] = np.arange(s)
            self._coll[o:o + s] = k
        self._ranks = np.arange(comm.nranks, dtype=np.int64) + 1
        self._expected_of: dict = {}    # phase -> expected receive set
        self._defined = self._outputs = self._all_phases = None
        self._expected(0)
        if self.input_sets == PERIOD:        # every input set, in one copy, before start()
            self.send_all[:] = np.concatenate([self._my_inputs(p) for p in range(PERIOD)])
        if 2 * PERIOD * self._recv_total * itemsize <= set_bytes:   # all now, outside the
            self._all_phases = np.concatenate(                      # timed iterations
                [self._expected(phase % PERIOD) for phase in range(2 * PERIOD)])
            self._expected_of.clear()

    def sends(self, it: int) -> list:
        """Iteration ``it``'s send buffers, one a collective."""
        return self._sends[it % PERIOD % self.input_sets]

    def recvs(self, it: int) -> list:
        """Iteration ``it``'s receive buffers, one a collective."""
        return self._recvs[it % self.batch]

    def fill(self, it: int) -> None:
        """Write iteration ``it``'s inputs (small integers, so that every sum is exact in
        every dtype) to this rank's send buffers, in one copy, where they share one set;
        nothing where every pattern has a set of its own, written when the buffers were
        made."""
        if self.input_sets == 1:
            self.send_all[:] = self._my_inputs(it % PERIOD)

    def _inputs(self, phase: int, ranks: np.ndarray) -> np.ndarray:
        """The whole send set's inputs in iterations of ``phase``, a row for each of
        ``ranks`` (each rank's number + 1)."""
        base = (self._pos + 7 * self._coll + 3 * phase) % PERIOD
        return (base[None, :] + ranks[:, None]).astype(self._host_dtype)

    def _my_inputs(self, phase: int) -> np.ndarray:
        """This rank's row of ``_inputs``: its whole send set in iterations of ``phase``."""
        return self._inputs(phase, self._ranks[self.comm.rank:self.comm.rank + 1])[0]

    def inputs(self, k: int, phase: int, every: np.ndarray | None = None) -> list[np.ndarray]:
        """Collective ``k``'s inputs of every rank in iterations of ``phase``, made as
        ``fill`` makes them (views of ``every``, the whole set's, where given): an
        all_to_allv's from each rank's own size."""
        if k in self.splits:
            base = 7 * k + 3 * phase
            return [((np.arange(int(row.sum())) + base) % PERIOD + r + 1).astype(
                self._host_dtype) for r, row in enumerate(self.splits[k])]
        o, s = self.send_at[k], self.sizes[k][0]
        every = self._inputs(phase, self._ranks) if every is None else every
        return list(every[:, o:o + s])

    def check(self, it: int, last: bool = False) -> int:
        """After iteration ``it``: once ``batch`` iterations' outputs are in (or after the
        ``last``), read them back in one copy and compare them with numpy's reference in a
        few whole-array operations; returns the outputs verified (a reduce's only at its
        root), 0 between checks. AssertionError names the first wrong element's iteration
        and collective."""
        sets = it % self.batch + 1
        if sets < self.batch and not last:
            return 0
        first_it = it - sets + 1
        got = np.asarray(self.recv_all[:sets * self._recv_total])
        want = self._expected_run(first_it % PERIOD, sets)
        wrong = got != want
        if self._defined is not None:
            wrong &= np.tile(self._defined, sets)
        if wrong.any():
            at = int(np.flatnonzero(wrong)[0])
            j, offset = divmod(at, self._recv_total)
            k = int(np.searchsorted(self.recv_at, offset, side="right") - 1)
            raise AssertionError(f"iteration {first_it + j}, collective {k} ({self.kinds[k]}): "
                                 f"element {offset - self.recv_at[k]} is {got[at]}, expected "
                                 f"{want[at]}")
        return sets * self._outputs

    def _expected_run(self, phase: int, sets: int) -> np.ndarray:
        """The expected receive sets of ``sets`` iterations from one of ``phase`` on, flat.
        Where every phase's fit in ``SET_BYTES`` twice over, they are laid out so, once, and
        any run of them is a view; otherwise each phase's are computed once and joined."""
        if self._all_phases is not None:
            return self._all_phases[phase * self._recv_total:(phase + sets) * self._recv_total]
        return np.concatenate([self._expected((phase + j) % PERIOD) for j in range(sets)])

    def _expected(self, phase: int) -> np.ndarray:
        """The expected receive set in iterations of ``phase``, made once. Sets ``_defined``
        (which of its elements are defined, None: all) and ``_outputs`` (outputs verified a
        set), the same in every phase."""
        if phase in self._expected_of:
            return self._expected_of[phase]
        want = np.zeros(self._recv_total, self._host_dtype)
        defined = np.zeros(self._recv_total, bool)
        outputs, every = 0, self._inputs(phase, self._ranks)
        for k, kind in enumerate(self.kinds):
            given = self.inputs(k, phase, every)
            out = (split_output(given, self.splits[k], self.comm.rank) if k in self.splits
                   else reference(kind, given, "sum", self.roots[k], self.comm.rank))
            if out is None:
                continue        # reduce: only the root's output is defined
            o = self.recv_at[k]
            want[o:o + out.size] = out
            defined[o:o + out.size] = True
            outputs += 1
        self._defined = None if defined.all() else defined
        self._outputs = outputs
        self._expected_of[phase] = want
        return want
