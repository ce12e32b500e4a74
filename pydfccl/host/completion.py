"""A rank's completion queue (CQ) on the host: it turns the daemon's CQ entries into
completed futures, and lets a thread waiting in ``Future.result()`` drain it itself.

The daemon posts a completion by writing the entry's stamp (its position + 1) last; any host
thread may drain, one at a time. The process's poller drains every rank's CQ, but a thread
blocked in ``result()`` is the fastest to learn of its completion, so it watches the next
stamp without the GIL (``hostspin``) and drains as soon as it is there: done-callbacks run
on whichever of the two completed the future.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import wait as wait_for_futures
from contextlib import nullcontext

from .. import platform
from ..log import logger
from ..protocol import layout as L
from .buffers import dropped_by_user, future_dropped
from .futures import CollectiveFuture
from .hostspin import spins_per_call, wait_for_stamp

__all__ = ["CompletionQueue"]


class CompletionQueue:
    """The CQ of rank ``rank`` in the control rows ``ctl``, completing the runs that
    ``submissions`` put in flight. ``state`` says whether the communicator is started;
    ``coll_ids`` names collectives by table index (for warnings); ``quits`` is False for a
    policy whose daemon never quits. The launch-per-collective baseline sets ``on_idle``
    (nothing outstanding any more; called with the lock held) and ``on_resubmitted`` (a
    completion let held runs into the SQ)."""

    def __init__(self, ctl, rank: int, lock, submissions, state, coll_ids: dict, quits: bool):
        self.rank = rank
        self._lock = lock
        self._submissions = submissions
        self._inflight = submissions.inflight
        self._submit_waiting = submissions.submit_waiting
        self._state = state
        self._coll_ids = coll_ids
        self._quits = quits
        self._stamp = ctl["cq"]["stamp"][rank]
        self._coll = ctl["cq"]["coll"][rank]
        self._stamp_addr = self._stamp.ctypes.data
        self._stamp_stride = self._stamp.strides[0]
        # a one-word view: a field lookup on the row makes a new view each time
        self._completed_word = ctl["host_completed"][rank: rank + 1]
        self._drain_lock = threading.Lock()
        self.head = 0              # the next CQ entry to drain
        self.completed = 0
        self.dropped_buffers = 0   # runs whose buffers only pydfccl held at completion
        self.helpers = 0           # threads waiting in Future.result() right now
        self.helped_at = 0.0       # when the last of them stopped (perf_counter)
        self.on_idle = None
        self.on_resubmitted = None
        self.on_done_slot = None   # shared slots: a run in this slot completed

    @property
    def outstanding(self) -> int:
        """Runs submitted and not completed on the host."""
        return self._submissions.submitted - self.completed

    def undone(self) -> int:
        """Outstanding runs whose CQ stamp is not posted yet: what a daemon is still needed
        for (caller holds the lock). A run the daemon finished waits for no daemon while the
        host has yet to drain it (a busy thread, a poller waiting for the GIL); counted as
        outstanding, they kept idle ranks' daemons relaunching every 10 to 17 ms on an
        H200. The head and ``completed`` move together under the lock, so the count is
        exact: the launcher's rule (``host.launcher``) relies on it."""
        undone, head = self.outstanding, self.head
        for _ in range(min(undone, L.CQ_CAP)):
            if self._stamp[head % L.CQ_CAP] != head + 1:
                break
            undone, head = undone - 1, head + 1
        return undone

    def next_stamp(self) -> tuple[int, int]:
        """(address, value) of the CQ stamp that announces the next completion."""
        head = self.head
        return self._stamp_addr + (head % L.CQ_CAP) * self._stamp_stride, head + 1

    def drain(self) -> int:
        """Complete the futures of new CQ entries; how many. Any host thread may call it;
        one that finds another draining returns 0 at once."""
        if not self._drain_lock.acquire(blocking=False):
            return 0
        try:
            return self._drain_locked()
        finally:
            self._drain_lock.release()

    def _drain_locked(self) -> int:
        done = []
        while True:
            slot = self.head % L.CQ_CAP
            if self._stamp[slot] != self.head + 1:
                break
            index = int(self._coll[slot])
            with self._lock:    # the head and the count move together: undone() reads both
                self.head += 1
                # (index, future, buffers), held by ``done`` alone: no local name holds the
                # future, which ``future_dropped`` counts on
                done.append((index, *self._inflight[index].popleft()))
                self.completed += 1
                self._completed_word[0] = self.completed
                if self.on_done_slot is not None:
                    self.on_done_slot(index)
                resubmitted = self._submit_waiting(index) > 0
                if self.on_idle is not None and not self.outstanding:
                    self.on_idle()     # no kernel of this rank waits for a peer
            if resubmitted and self.on_resubmitted is not None:
                self.on_resubmitted()
        if done:
            count = len(done)
            self._complete(done)
            return count
        return 0

    def _complete(self, done: list) -> None:
        """Set the futures of ``done`` (and empty it). Device memory must not be freed on
        this thread (the poller, or a thread waiting in ``result()``): ``cuMemFree`` waits
        for every kernel on the device, a daemon that never quits among them. A free can
        happen here when the user dropped a run's buffers (this holds their last reference),
        in a done-callback, or under a daemon that never quits; only then are Numba's frees
        held (``platform.deferred_frees``), which costs microseconds per completion."""
        risky = not self._quits
        dropped = []
        for entry in done:     # before set_result, which holds recv
            roles = dropped_by_user(entry[2]) if future_dropped(entry, 1) else []
            dropped.append(roles)
            risky = risky or entry[1].has_callbacks or bool(roles)
        with platform.deferred_frees() if risky else nullcontext():
            for (index, future, buffers), roles in zip(done, dropped):
                for role in roles:
                    self.dropped_buffers += 1
                    logger.warning("rank %d: collective %d's %s buffer was dropped by the "
                                   "user before the collective completed; pydfccl kept it "
                                   "alive until then", self.rank, self._coll_ids[index], role)
                future.set_result(buffers[1])
            done.clear()

    def help_until_done(self, future, timeout) -> None:
        """Drain from the calling thread until ``future`` is done (or a short while: the
        future's ``SPIN_SECONDS``). The thread watches the next stamp without the GIL and
        drains as soon as it is there. Only a stamp that is there but that this thread
        could not drain (another thread waiting on this rank holds the drain; the poller
        leaves it to them) makes it sleep on the future, rather than spin against that
        thread for the GIL."""
        if future.finished or not self._state.started:
            return
        spin = CollectiveFuture.SPIN_SECONDS
        end = time.perf_counter() + (spin if timeout is None else min(spin, timeout))
        self.helpers += 1
        try:
            seen = False       # the stamp was there at this thread's last look
            while not future.finished and time.perf_counter() < end:
                if self.drain():
                    seen = False
                elif seen:     # there, yet not drained here: another thread drains it
                    wait_for_futures([future], timeout=1e-3)
                    seen = False
                else:
                    seen = wait_for_stamp(*self.next_stamp(), spins_per_call())
        finally:
            self.helpers -= 1
            if future.finished:   # it drained for itself and is likely back for the next one;
                #                 a thread that gave up waits for the poller, which must not
                #                 take it for a helper and sleep
                self.helped_at = time.perf_counter()
