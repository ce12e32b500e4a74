"""Submission: the writer of a rank's submission queue (SQ), and per collective its runs in
the SQ and the runs held on the host behind them.

At most ``RUNS_IN_FLIGHT`` runs of a collective are in the SQ; further runs wait on the host,
so the k-th run on every rank meets the k-th run on every other rank. Every method runs
with the communicator's lock held (``fail_all`` takes it itself).
"""

from __future__ import annotations

import collections

from ..protocol import layout as L
from .poison import poison

__all__ = ["Submissions"]


class Submissions:
    """``inflight[index]``: the runs of collective ``index`` in the SQ and not completed,
    oldest first, as (future, (send, recv)); ``pending[index]``: the runs held on the host
    behind them; ``held``: collectives whose runs all wait on the host (a late registration
    its peers have not confirmed), with when each was held. ``wake`` is called when runs
    enter the SQ other than by ``add`` (the launcher's notify, from ``start`` on)."""

    def __init__(self, ctl, rank: int, lock):
        self._lock = lock
        self._sq = {name: ctl["sq"][name][rank] for name in L.SQ_ENTRY.names}
        # a one-word view: a field lookup on the row makes a new view each time
        self._submitted_word = ctl["host_submitted"][rank: rank + 1]
        self.submitted = 0
        self.inflight = collections.defaultdict(collections.deque)
        self.pending = collections.defaultdict(collections.deque)
        self.held: dict[int, float] = {}
        self.waiting: dict[int, collections.deque] = {}   # by coll_id: runs that wait for
        #                                                  a shared slot (shared_slots.py)
        self.wake = None

    def add(self, index: int, future, send_addr: int, recv_addr: int, prio: int,
            buffers: tuple) -> None:
        """A new run of ``index``: into the SQ, or behind the runs that wait already."""
        waiting = self.pending[index]
        if waiting or index in self.held or len(self.inflight[index]) >= L.RUNS_IN_FLIGHT:
            waiting.append((future, send_addr, recv_addr, prio, buffers))
        else:
            self._write(index, future, send_addr, recv_addr, prio, buffers)

    def _write(self, index: int, future, send_addr: int, recv_addr: int, prio: int,
               buffers: tuple) -> None:
        """One SQ entry; the seq word goes last: the daemon takes the entry once it sees it.
        ``buffers`` (send, recv) stay referenced until completion: the daemon only has
        their addresses."""
        sq, k = self._sq, self.submitted
        slot = k % L.SQ_CAP
        sq["coll"][slot] = index
        sq["send"][slot] = send_addr
        sq["recv"][slot] = recv_addr
        sq["priority"][slot] = prio
        sq["seq"][slot] = k + 1
        self.submitted = k + 1
        self._submitted_word[0] = k + 1
        self.inflight[index].append((future, buffers))

    def submit_waiting(self, index: int) -> int:
        """Submit the runs of ``index`` held on the host, as many as RUNS_IN_FLIGHT allows;
        how many."""
        waiting, inflight, count = self.pending[index], self.inflight[index], 0
        while waiting and len(inflight) < L.RUNS_IN_FLIGHT:
            self._write(index, *waiting.popleft())
            count += 1
        if count and self.wake is not None:
            self.wake()
        return count

    def hold(self, index: int, since: float) -> None:
        """Hold every run of ``index`` on the host until ``release``."""
        self.held[index] = since

    def release(self, index: int) -> None:
        """End ``hold``: the runs of ``index`` may go to the SQ (``submit_waiting``)."""
        del self.held[index]

    def in_flight_indices(self) -> list[int]:
        return [i for i, runs in self.inflight.items() if runs]

    def waiting_count(self) -> int:
        """Runs waiting for a shared slot's grant."""
        return sum(len(q) for q in self.waiting.values())

    def queued_counts(self) -> dict[int, int]:
        return {i: len(q) for i, q in self.pending.items() if q}

    def fail_all(self, error: Exception) -> None:
        """Fail every run in the SQ or held, and forget them (takes the lock). Their float
        recv buffers in host memory are filled with NaN first (``poison``): nothing may
        take what a failed run left there for its result."""
        with self._lock:
            runs = [run for queue in self.inflight.values() for run in queue]
            runs += [(item[0], item[-1]) for queues in (self.pending, self.waiting)
                     for queue in queues.values() for item in queue]
            futures = [future for future, _ in runs]
            for future, (_, recv) in runs:
                if not future.done():
                    poison(recv)
            self.inflight.clear()
            self.pending.clear()
            self.waiting.clear()
            if self.wake is not None:
                self.wake()
        for future in futures:
            if not future.done():
                future.set_exception(error)
