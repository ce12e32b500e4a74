"""What the process's poller (``host.poller``) does for one rank, and all it sees of it.

Each turn the poller beats the rank's heartbeat, asks whether the rank needs polling, and
if so polls it once: late registrations confirmed, the CQ drained (unless a thread waiting
in ``result()`` drains it), else an abort, a stall (the watchdog) or a lost launch looked
for. Between turns it watches ``next_stamp()`` without the GIL. A thread of its own drains
the daemon's event log (``drain_trace``).
"""

from __future__ import annotations

from ..errors import PydfcclError
from ..log import logger
from .launcher import LauncherError

__all__ = ["PolledRank"]


class PolledRank:
    """The poller's view of rank ``rank``: its control ``row`` (a one-row slice of the
    control rows), its ``state``, CQ, submissions, late registrations, watchdog, launcher
    and trace reader; ``persistent`` is False for the launch-per-collective baseline,
    whose launches the launcher does not keep."""

    HEARTBEAT_NS = 10_000_000    # how often the heartbeat is refreshed

    def __init__(self, rank: int, row, state, cq, submissions, late, watchdog, launcher,
                 tracer, persistent: bool, shared=None):
        self.rank = rank
        self._heartbeat = row["heartbeat"]
        self._abort = row["abort"]
        self._host_blocked = row["host_blocked"]
        self._state, self._cq, self._submissions = state, cq, submissions
        self._held = submissions.held     # late registrations that wait for their peers
        self._late, self._watchdog, self._launcher = late, watchdog, launcher
        self._tracer = tracer
        self._persistent = persistent
        self._shared = shared      # shared_slots.SharedSlots: more collectives than slots
        self._beat_at = 0

    # -- what the poller reads --------------------------------------------------------------

    @property
    def helpers(self) -> int:
        """Threads waiting in ``Future.result()`` on this rank now (they drain its CQ)."""
        return self._cq.helpers

    @property
    def helped_at(self) -> float:
        """When the last of them stopped, having seen its future done (perf_counter)."""
        return self._cq.helped_at

    @property
    def submitted(self) -> int:
        """Runs submitted so far: a change means new events for the trace drain."""
        return self._submissions.submitted

    def next_stamp(self) -> tuple[int, int]:
        """(address, value) of the CQ stamp that announces this rank's next completion."""
        return self._cq.next_stamp()

    def needs_polling(self) -> bool:
        state = self._state
        return state.started and state.error is None and (
            self._cq.outstanding > 0 or bool(self._host_blocked[0]) or bool(self._held)
            or (self._shared is not None and self._shared.needs_polling()))

    # -- what the poller does -----------------------------------------------------------------

    def beat(self, now_ns: int, force: bool = False) -> None:
        """Tell the peers this rank's host is alive (the poller calls it every turn)."""
        if force or now_ns - self._beat_at > self.HEARTBEAT_NS:
            self._heartbeat[0] = now_ns
            self._beat_at = now_ns

    def poll_once(self) -> bool:
        """Complete what the CQ holds, else look for an abort or a stall; True if any
        future completed. A failure here fails this rank's futures, not the poller. A CQ
        that a thread waiting in ``result()`` drains is left to it: taken from under it,
        that thread would find the drain held and sleep on its future until woken, a
        thread hand-off that costs tens of microseconds."""
        state, cq = self._state, self._cq
        try:
            if self._held and self._late.confirm():
                return True
            if self._shared is not None and self._shared.poll():
                return True
            if not cq.helpers and cq.drain():
                return True
            if self._abort[0]:
                if state.started:    # a peer's watchdog, or a failed rank
                    state.fail(state.abort_error())
                return False
            if self._watchdog.check():
                state.fail(state.abort_error())   # a deadlock, or a peer that died
            elif self._persistent and cq.outstanding:
                self._launcher.check()      # raises LauncherError if a launch was lost
        except LauncherError as exc:        # its peers would wait for it: abort them too
            state.fail_everywhere(exc)
        except Exception as exc:
            state.fail(PydfcclError(f"rank {self.rank}: completion poller failed: {exc!r}"))
        return False

    def drain_trace(self) -> int:
        """Copy new event-log records in (the poller's trace thread calls it); the most
        a block had (0 if none were read)."""
        if not self._state.started:   # closing: its pool may be going away
            return 0
        try:
            return self._tracer.drain()
        except Exception as exc:     # a failed copy loses events, never a collective
            if self._state.started:
                logger.warning("rank %d: reading the daemon's event log failed: %r",
                               self.rank, exc)
            return 0
