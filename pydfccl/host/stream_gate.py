"""Starting runs when a CUDA stream reaches them, without blocking the host.

``run(..., stream=s)`` gates its run on ``s``: a gated run j gets a ``ready`` word in mapped
host memory (slot j % N; stamps grow, so a slot is reused safely). A stream write
(``cuStreamWriteValue64``) queued on ``s`` sets ``ready = j + 1`` once the work queued
before it has finished (the driver flushes that work's writes first, so the inputs are
visible), and a watcher thread submits the run when it sees the word.

Nothing on the GPU ever waits for a run: its result is waited for on the host
(``Future.result()``). A stream that waited for a collective on the GPU
(``cuStreamWaitValue``) would be a wait that no daemon quit can end: a device-wide wait
queued behind it (a device synchronize, a synchronous copy, a lazy module load,
``cuMemFree``) then needs the collective, the collective needs the daemons of every rank,
and a daemon that has quit needs a relaunch, which such a wait can hold up. That cycle
stalled a 4-rank training job on one GPU; see docs/design.md, "Streams".

Runs of one collective start in the order they were submitted (the k-th run of a
collective on every rank is one collective): a run behind a gated run of its collective
waits for it, whether it has a stream or not. The driver calls are the backend's
(``platform.stream_write_ops``); tests pass a stand-in with the same two methods.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

__all__ = ["StreamGate", "Ticket", "process_gate"]


class Ticket:
    """One gated run: ``start()`` submits it once its stream has reached the gate (``slot``
    None: no stream, it waits only for earlier runs of its ``key``); an exception from
    ``start`` goes to ``fail``."""

    __slots__ = ("stamp", "slot", "key", "start", "fail")

    def __init__(self, stamp: int, slot: int | None, key, start, fail):
        self.stamp, self.slot, self.key, self.start, self.fail = stamp, slot, key, start, fail


class StreamGate:
    """Gated runs of one process, submitted by a watcher thread as their streams reach
    them. ``ops``: ``mapped_words(n)`` and ``write(stream, addr, value)``."""

    POLL_SECONDS = 20e-6

    def __init__(self, ops, nwords: int = 4096, bind_thread=None):
        self._ops = ops
        self.nwords = nwords
        self._ready, self._ready_addr = ops.mapped_words(nwords)
        self._stamp = 0
        self._waiting: list[Ticket] = []      # in submission order, not yet started
        self._keys: Counter = Counter()       # tickets of each key not yet submitted
        self._cond = threading.Condition()
        self._bind_thread = bind_thread
        self._thread = threading.Thread(target=self._watch, name="pydfccl-stream-gate",
                                        daemon=True)
        self._thread.start()

    def waiting(self, key) -> bool:
        """Whether a run of ``key`` has not been submitted yet (a later run of ``key`` must
        then queue behind it, through ``gate``)."""
        return self._keys[key] > 0

    def gate(self, stream: int | None, start, fail, key=None) -> Ticket:
        """Queue ``start`` behind the work on ``stream`` (a raw handle; None: behind earlier
        runs of ``key`` only)."""
        with self._cond:
            self._stamp += 1
            slot = None
            if stream is not None:
                # A slot is reused only once its previous ticket has been seen, or that
                # ticket's stream would write over the newer stamp.
                oldest = next((t for t in self._waiting if t.slot is not None), None)
                if oldest is not None and self._stamp - oldest.stamp >= self.nwords:
                    self._stamp -= 1
                    raise RuntimeError(f"pydfccl: {self.nwords} stream-ordered runs since the "
                                       "oldest one whose stream has not reached it; that "
                                       "stream does not progress")
                slot = (self._stamp - 1) % self.nwords
                self._ops.write(stream, self._ready_addr + 8 * slot, self._stamp)
            ticket = Ticket(self._stamp, slot, key, start, fail)
            self._waiting.append(ticket)
            self._keys[key] += 1
            self._cond.notify()
        return ticket

    def _submitted(self, key) -> None:
        """A ticket of ``key`` is submitted (or failed): only now may a later run of
        ``key`` that has no stream go straight to the communicator."""
        with self._cond:
            self._keys[key] -= 1
            if not self._keys[key]:
                del self._keys[key]       # keys hold their communicator: none kept idle

    def _reached(self, ticket: Ticket) -> bool:
        return ticket.slot is None or self._ready[ticket.slot] >= ticket.stamp

    def _take_ready(self) -> list[Ticket]:
        """The tickets that can start now, in order: reached, and no earlier ticket of
        their key still waiting."""
        ready, blocked = [], set()
        for t in self._waiting:
            if t.key in blocked:
                continue
            if self._reached(t):
                ready.append(t)
            else:
                blocked.add(t.key)
        for t in ready:
            self._waiting.remove(t)
        return ready

    def _watch(self) -> None:
        if self._bind_thread is not None:
            self._bind_thread()    # a submission may touch the rank's GPU (a table write)
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                ready = self._take_ready()
            for t in ready:
                try:
                    t.start()
                except BaseException as exc:     # a submission's error belongs to its run
                    t.fail(exc)
                finally:
                    self._submitted(t.key)
            if not ready:
                time.sleep(self.POLL_SECONDS)


_gate = None
_gate_lock = threading.Lock()


def process_gate() -> StreamGate | None:
    """The process's gate, made on first use; None where kernels run on the host (the
    simulator: a stream has always reached its end, so a run can start at once)."""
    global _gate
    from .. import platform

    with _gate_lock:
        if _gate is None:
            ops = platform.stream_write_ops()
            if ops is None:
                return None
            _gate = StreamGate(ops, bind_thread=platform.bind_thread)
        return _gate
