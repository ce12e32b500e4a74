"""The Future that ``Communicator.run`` returns: a ``concurrent.futures.Future`` made cheap.

A ``concurrent.futures.Future`` builds a ``threading.Condition`` when it is made (1.2 us on
the H200's host) and takes it to start, to finish and to read its result: making, finishing
and reading one took 5.1 us against 1.0 us for a ``CollectiveFuture`` (timeit on a 2-core
machine). Most of pydfccl's futures are finished by the very thread that then reads them,
with nobody blocked on them, so a ``CollectiveFuture`` makes its condition only when
something needs one: a thread that blocks in ``result()``, a done-callback,
``concurrent.futures.wait`` or ``as_completed``.
Everything the base class does goes through ``_condition``, so it keeps working unchanged;
only finishing and reading a future nobody waits on skip it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures._base import (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, PENDING,
                                      RUNNING)

from ..platform import backend

__all__ = ["CollectiveFuture"]

# Guards the moment a future's condition is made against a finish without one: either the
# finish comes first (and whoever makes the condition then finds the future finished) or
# the condition does (and the finish takes the base class's way, waking its waiters).
_making_condition = threading.Lock()


class CollectiveFuture(Future):
    """A Future whose ``result()`` helps: while it waits, the calling thread drains the
    completion queue itself instead of waiting for the poller thread to wake it, which
    saves a thread hand-off (tens of microseconds in Python) per collective. ``queue`` is
    what it helps: anything with ``help_until_done(future, timeout)`` (a
    ``completion.CompletionQueue``). ``buffers`` (send, recv) are kept alive until the
    future is finished; ``coll_id`` names the collective in a timeout's message."""

    SPIN_SECONDS = backend.waiter_spin_seconds   # then a blocking wait on the poller

    def __init__(self, queue, running: bool = False, buffers: tuple | None = None,
                 coll_id=None):
        # the base class's state, less the condition (made on first use, below)
        self._state = RUNNING if running else PENDING
        self._result = None
        self._exception = None
        self._waiters = []
        self._done_callbacks = []
        self._lazy_condition = None
        self._queue = queue
        self.coll_id = coll_id
        self._buffers = buffers      # (send, recv): the daemon has only their addresses,
        #                              so whoever holds the future holds them until the end
        self.has_callbacks = False   # a callback may free device memory where it runs
        self.finished = False        # set before the result: a waiting thread reads it
        #                              without done()'s lock

    @property
    def _condition(self) -> threading.Condition:
        cond = self._lazy_condition
        if cond is None:
            with _making_condition:
                if self._lazy_condition is None:
                    self._lazy_condition = threading.Condition()
                cond = self._lazy_condition
        return cond

    def set_result(self, result):
        self.finished = True
        self._buffers = None         # the result (recv) is held from now on
        with _making_condition:
            if self._lazy_condition is None and self._state == RUNNING:
                # nobody waits and no callback is registered: both would have made it
                self._result = result
                self._state = FINISHED
                return
        super().set_result(result)

    def set_exception(self, exception):
        self.finished = True
        self._buffers = None
        super().set_exception(exception)

    def add_done_callback(self, fn):
        self.has_callbacks = True
        super().add_done_callback(fn)

    def done(self) -> bool:
        return self._state in (FINISHED, CANCELLED, CANCELLED_AND_NOTIFIED)   # one read

    def result(self, timeout=None):
        self._queue.help_until_done(self, timeout)
        if self._state == FINISHED and self._exception is None:
            return self._result    # final once set: no lock needed to read it
        try:
            return super().result(timeout)
        except FutureTimeout:
            raise self._timed_out(timeout) from None

    def exception(self, timeout=None):
        self._queue.help_until_done(self, timeout)
        if self._state == FINISHED:
            return self._exception
        try:
            return super().exception(timeout)
        except FutureTimeout:
            raise self._timed_out(timeout) from None

    def _timed_out(self, timeout) -> FutureTimeout:
        """The base class's bare TimeoutError, with what timed out and what to do."""
        rank = getattr(self._queue, "rank", None)
        outstanding = getattr(self._queue, "outstanding", None)
        who = f"rank {rank}: " if rank is not None else ""
        what = f"collective {self.coll_id!r}" if self.coll_id is not None else "the run"
        more = (f" ({outstanding} run(s) of this rank outstanding)"
                if outstanding is not None else "")
        return FutureTimeout(
            f"{who}{what} did not complete within {timeout:g} s{more}; it is still in "
            "flight: call result() again to keep waiting, and Communicator.status() for "
            "what it waits on")
