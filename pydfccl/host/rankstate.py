"""A rank's phase (preparing, started, closed) and the first error that failed it.

Every part of a communicator reads both before it acts; only the communicator changes the
phase. An error fails every run still outstanding and stays: later runs raise it.
"""

from __future__ import annotations

import enum

from ..errors import AbortedError, DeadlockError, PydfcclError
from ..log import logger

__all__ = ["Phase", "RankState"]


class Phase(enum.Enum):
    PREPARING = "preparing"    # prepare() registers; start() ends it
    STARTED = "started"        # runs are submitted and completed
    CLOSED = "closed"          # the daemon is stopped, the host threads joined


_ALLOWED = {Phase.PREPARING: "before start()", Phase.STARTED: "after start() and before close()"}


class RankState:
    """``phase`` and ``error`` of rank ``rank`` of ``world``. ``fail_runs(error)`` fails the
    runs outstanding (``Submissions.fail_all``); ``lock`` is the communicator's."""

    def __init__(self, world, rank: int, lock, fail_runs):
        self.world, self.rank = world, rank
        self._lock = lock
        self._fail_runs = fail_runs
        self.phase = Phase.PREPARING
        self.error: Exception | None = None

    @property
    def phase(self) -> Phase:
        return self._phase

    @phase.setter
    def phase(self, phase: Phase) -> None:
        # ``started`` is a plain attribute: every run reads it, and reading an enum member
        # (``Phase.STARTED``) costs a descriptor call on Python 3.11
        self._phase = phase
        self.started = phase is Phase.STARTED

    def require(self, phase: Phase, what: str) -> None:
        """Raise unless the communicator is in ``phase``: ``what()`` is not allowed now."""
        if self.phase is not phase:
            raise PydfcclError(f"{what}() is only allowed {_ALLOWED[phase]}; "
                               f"this communicator is {self.phase.value}")

    def raise_if_failed(self) -> None:
        """Raise the first error of this rank (or of the job, once aborted): a failed
        communicator runs nothing more, so no later call can build on a failed run."""
        with self._lock:
            if self.error is None and self.world.ctl["abort"][self.rank]:
                self.error = self.abort_error()
            error = self.error
        if error is not None:
            raise error

    def abort_error(self) -> Exception:
        """The error an abort of every rank means here, from the report it left."""
        report = self.world.get_report() or f"rank {self.rank}: aborted"
        stall = report.startswith(("deadlock", "timeout:"))
        return DeadlockError(report) if stall else AbortedError(report)

    def fail(self, error: Exception) -> None:
        """Fail this rank with ``error`` (the first error stays) and every run it has out."""
        with self._lock:
            if self.error is None:
                self.error = error
                logger.warning("rank %d: %s", self.rank, error)
        self._fail_runs(self.error)

    def fail_everywhere(self, error: Exception) -> None:
        """Abort every rank with ``error``'s text as the report (the first report stays)."""
        self.world.abort_with(f"rank {self.rank}: {error}")
        self.fail(error)
