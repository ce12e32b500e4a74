"""The host poller: one thread per process that completes every communicator's futures.

Ranks that are threads of one process share one GIL, so a poller per rank means several
threads taking the GIL every few microseconds, and a rank thread that has just learned of
its completion waits behind them. One poller serves every communicator of the process
instead. While collectives are outstanding it watches all their next CQ stamps at once with
the GIL released (``hostspin``), then completes futures and runs done-callbacks, and runs
each communicator's watchdog. It touches host memory only, never the device: a device copy
can wait behind the application's streams (on the H200 under MPS, behind a torch stream
gated on a collective that only this thread could complete). The daemons' event logs are
copied from the device by a thread of their own (``_drain_traces``), before a ring wraps.
It leaves the GIL alone (but for a turn every millisecond) while every busy communicator
has a thread waiting in ``Future.result()``, which drains that CQ itself, and watches only
the others' stamps; it sleeps on a condition (50 ms at a time) when nothing is
outstanding. Every turn it refreshes each communicator's heartbeat in the shared control
rows: a peer whose heartbeat stops is reported as a failed rank (``watchdog.silent_ranks``).

It sees a communicator only through a ``polled.PolledRank``: ``beat``, ``needs_polling``,
``poll_once``, ``next_stamp``, ``drain_trace``, and the counters ``helpers``, ``helped_at``
and ``submitted``.
"""

from __future__ import annotations

import atexit
import threading
import time

import numpy as np

from .. import platform
from ..platform import backend
from .hostspin import CALL_SECONDS, spins_per_call, wait_for_any_stamp
from .trace import TRACE_DRAIN_SECONDS, next_drain_interval

__all__ = ["poller"]

# Every busy communicator has a thread waiting in result() that drains for itself, or had
# one this recently (it is likely back soon): the poller then only beats and watches, every
# SLEEP_WHEN_HELPED. Each of its turns takes the GIL for microseconds; at 100 us the 2-rank
# 8-byte latency from one thread was 66.4 us, at 1 ms 54.7 us (on an H200).
SLEEP_WHEN_HELPED = 1e-3
HELPED_RECENTLY = 1e-3
SLEEP_WHEN_QUIET = 2e-6      # simulator: no spinning, short sleeps
QUIET_LOOKS = 2000           # then 100 us between looks
SPIN_ROUNDS = round(10e-3 / CALL_SECONDS)   # GPU: 10 ms of watching, then sleeps instead


def unhelped_comms(busy: list, now_s: float) -> list:
    """The ranks of ``busy`` that no thread waiting in ``result()`` drains now, nor did
    within HELPED_RECENTLY (``now_s``: ``time.perf_counter()``): the poller's to watch."""
    return [c for c in busy if not c.helpers and now_s - c.helped_at >= HELPED_RECENTLY]


class Poller:
    """``add`` and ``remove`` the ``PolledRank`` of each communicator that starts and
    closes; ``wake`` after a submission."""

    def __init__(self):
        self._comms: list = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._tracer_thread: threading.Thread | None = None
        self.sleeping = False
        self._stopping = False
        # bumped by every wake(): a watch of other ranks' stamps ends at once when a rank
        # submits, rather than at the end of its call, so that rank's stamp is watched too
        self._kick = np.zeros(1, np.int64)

    def add(self, comm) -> None:
        with self._cond:
            self._comms.append(comm)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pydfccl-poller",
                                                daemon=True)
                self._thread.start()
            if self._tracer_thread is None or not self._tracer_thread.is_alive():
                self._tracer_thread = threading.Thread(target=self._drain_traces,
                                                       name="pydfccl-trace", daemon=True)
                self._tracer_thread.start()
            self._cond.notify_all()

    def remove(self, comm) -> None:
        with self._cond:
            if comm in self._comms:
                self._comms.remove(comm)
            self._cond.notify_all()

    def shutdown(self) -> None:
        """At interpreter exit, before numba-cuda's exit handlers: stop both threads. A
        communicator left open keeps them busy, and a device copy or a read of mapped host
        memory made while those handlers free it kills the process (a trace drain's copy
        did, on the H200 at the end of a demo: SIGSEGV)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in (self._thread, self._tracer_thread):
            if thread is not None and thread is not threading.current_thread():
                thread.join(timeout=1.0)

    def wake(self) -> None:
        """New work was submitted: end the poller's sleep or watch (cheap when neither)."""
        self._kick[0] += 1
        if self.sleeping:
            with self._cond:
                self._cond.notify_all()

    def _loop(self) -> None:
        platform.bind_thread()
        platform.precise_sleeps()
        quiet = 0
        while not self._stopping:
            with self._cond:
                now = time.monotonic_ns()
                for c in self._comms:
                    c.beat(now)
                busy = [c for c in self._comms if c.needs_polling()]
                if not busy:
                    self.sleeping = True
                    self._cond.wait(0.05)
                    self.sleeping = False
                    quiet = 0
                    continue
            if any([c.poll_once() for c in busy]):
                quiet = 0
                continue
            quiet += 1
            unhelped = unhelped_comms(busy, time.perf_counter())
            if not unhelped:
                time.sleep(SLEEP_WHEN_HELPED)
            elif backend.waiter_spin_seconds > 0 and quiet < SPIN_ROUNDS:
                addrs, wants = zip(*(c.next_stamp() for c in unhelped))
                addrs += (self._kick.ctypes.data,)
                wants += (int(self._kick[0]) + 1,)
                wait_for_any_stamp(np.array(addrs, np.int64), np.array(wants, np.int64),
                                   spins_per_call())
            else:
                time.sleep(SLEEP_WHEN_QUIET if quiet < QUIET_LOOKS else 1e-4)

    def _drain_traces(self) -> None:
        """Copy new event-log records from the device, for every communicator that
        submitted work since its last drain or still has work out, as often as the
        fullest ring asks (``trace.next_drain_interval``)."""
        platform.bind_thread()
        seen: dict = {}
        interval = TRACE_DRAIN_SECONDS[0]
        while not self._stopping:
            time.sleep(interval)
            with self._cond:
                comms = [] if self._stopping else list(self._comms)
            most = 0
            for c in comms:
                if c.submitted != seen.get(id(c)) or c.needs_polling():
                    seen[id(c)] = c.submitted
                    most = max(most, c.drain_trace())
            seen = {id(c): seen[id(c)] for c in comms if id(c) in seen}
            interval = next_drain_interval(interval, most)


poller = Poller()
# atexit runs its handlers last registered first; numba-cuda's, which run the finalizers
# that free device and mapped host memory (weakref.finalize's), are registered when it is
# imported, before this module is: so this one runs before them.
atexit.register(poller.shutdown)
