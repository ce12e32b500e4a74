"""Collectives prepared after ``start()``: placed without an exchange, published in this
rank's control row, and run once every peer has published the same signature.

Every rank places them alike (``registration.LatePlacer``); the runs of one wait on the host
(``Submissions.hold``) until the poller has seen each peer publish it, and a difference, or a
peer that never publishes, aborts every rank with a report that names it
(``registration.late_verdict``).
"""

from __future__ import annotations

import time

import numpy as np

from ..protocol import layout as L
from ..protocol.collectives import ONE_SHOT
from ..protocol.codes import POINT_TO_POINT, dtype_code, kind_code, op_code
from .poller import poller
from .registration import LatePlacer, late_verdict

__all__ = ["LateRegistrations"]


class LateRegistrations:
    """Late registrations of rank ``rank``: ``add`` places and publishes one, ``confirm``
    (the poller's) releases the runs of those every peer has published. ``timeout``: how
    long a peer may take to publish (a late peer is not a wrong one: the user's timeout);
    a peer that closed without publishing fails it at once. The
    launch-per-collective baseline sets ``on_submitted`` (first runs went to the SQ)."""

    def __init__(self, world, rank: int, lock, catalog, submissions, state, timeout: float):
        self.world, self.rank = world, rank
        self._lock = lock
        self._catalog = catalog
        self._submissions = submissions
        self._state = state
        self.timeout = timeout
        self._placer: LatePlacer | None = None
        self._published = world.ctl[rank: rank + 1]["registered"][0]
        self.on_submitted = None

    def begin(self, placer: LatePlacer) -> None:
        """From ``start()`` on: places follow the ones ``start`` gave."""
        self._placer = placer

    def fits(self, kind: str) -> bool:
        """Whether another collective of ``kind`` has a slot of its own left."""
        return self._placer.fits(kind)

    def add(self, spec) -> None:
        """Place ``spec``, write its table entry (the daemon reads it at the first run,
        after an acquire of that run's SQ entry) and publish it for the peers."""
        if spec.kind in POINT_TO_POINT:
            sender, receiver = ((self.rank, spec.root) if spec.kind == "send"
                                else (spec.root, self.rank))
            index, conn = self._placer.transfer(sender, receiver)
        else:
            index, conn = self._placer.collective(spec.kind)
        entry = np.array([self._catalog.table_entry(spec, conn)], L.COLL_ENTRY)
        self.world.pools[self.rank].write(L.P_COLLS + index * L.COLL_ENTRY.itemsize, entry)
        published = self._published
        one_shot = int(entry["kind"][0] == ONE_SHOT)
        published[index] = (0, spec.coll_id, kind_code(spec.kind), dtype_code(spec.dtype),
                            op_code(spec.op), spec.count, spec.root, one_shot)
        published["published"][index] = 1       # last: the peers read the fields after it
        with self._lock:
            self._catalog.place(spec.coll_id, index)
            self._submissions.hold(index, time.monotonic())
        poller.wake()

    def confirm(self) -> bool:
        """Compare the waiting registrations with what the peers published; submit the
        first runs of each one confirmed. True if a run was submitted."""
        submitted = False
        registered = self.world.ctl["registered"]
        heartbeat = self.world.ctl["heartbeat"]
        for index, since in list(self._submissions.held.items()):
            # who had closed, read before what was published: a rank publishes before it
            # closes, so one read closed here and unpublished below never published
            gone = set(np.flatnonzero(heartbeat == -1).tolist())
            try:
                missing = late_verdict(registered, index, self.rank)
            except ValueError as exc:
                self._state.fail_everywhere(exc)
                return False
            if missing:
                closed = [r for r in missing if r in gone]
                if closed and self.world.get_report():
                    # they closed because another rank aborted the job: that is the cause
                    self._state.fail(self._state.abort_error())
                    return False
                if closed or time.monotonic() - since > self.timeout:
                    self._state.fail_everywhere(self._unmatched(index, missing, closed))
                    return False
                continue
            with self._lock:
                self._submissions.release(index)
                first = self._state.error is None and self._submissions.submit_waiting(index) > 0
            if first and self.on_submitted is not None:
                self.on_submitted()
            submitted = submitted or first
        return submitted

    def _unmatched(self, index: int, missing: list, closed: list) -> ValueError:
        spec = self._catalog.spec_at(index)
        why = (f"ranks {closed} closed their communicator without preparing it" if closed
               else f"not on ranks {missing} within {self.timeout:.0f} s")
        return ValueError(
            f"collective {spec.coll_id} ({spec.kind}, count {spec.count}, {spec.dtype}) was "
            f"prepared on rank {self.rank} but {why}: the ranks' calls differ (every rank "
            "must issue a group's collectives in the same order)")
