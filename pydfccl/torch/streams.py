"""Ordering pydfccl runs with a CUDA stream without blocking the host.

A gated run j gets two words in mapped host memory, ``ready`` and ``done`` (slot j % N;
stamps grow, so a slot is reused safely). ``cuStreamWriteValue64`` on the caller's stream
writes ``ready = j + 1`` once the work queued before it has finished (the driver fences
before the write, so the inputs are visible). A watcher thread submits the run when it sees
the word. When the run completes, the host writes ``done = j + 1``; a stream that needs the
result waits with ``cuStreamWaitValue64(done >= j + 1)``, which the GPU's front end
evaluates without occupying an SM, so it cannot keep the daemon from running.

All CUDA driver calls are in ``DriverStreamOps``; tests pass a stand-in with the same
three methods. On the H200 (2026-11-29, docs/torch.md) the gate, with the hold that
``Ticket.wait_on`` takes, ran the torch tests with rank processes and the examples.
"""

from __future__ import annotations

import ctypes
import threading
import time
from concurrent.futures import Future

import numpy as np

__all__ = ["DriverStreamOps", "StreamGate", "Ticket"]


class DriverStreamOps:
    """The three driver operations the gate needs, through cuda-python."""

    def __init__(self):
        from cuda.bindings import driver
        self._d = driver

    def _check(self, result, what):
        from ..platform import driver_result
        return driver_result(result, f"pydfccl.torch: {what}")

    def mapped_words(self, n: int) -> tuple[np.ndarray, int]:
        """``n`` zeroed int64 words of pinned host memory the GPU can reach: (host view,
        device address). Allocated once per gate and kept for the process's life."""
        d = self._d
        flags = d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE
        ptr = self._check(d.cuMemHostAlloc(8 * n, flags), "cuMemHostAlloc")
        host = np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(int(ptr)))
        host[:] = 0
        dev = self._check(d.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer")
        return host, int(dev)

    def write(self, stream: int, addr: int, value: int) -> None:
        d = self._d
        flags = d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
        self._check(d.cuStreamWriteValue64(d.CUstream(stream), d.CUdeviceptr(addr), value,
                                           flags), "cuStreamWriteValue64")

    def wait(self, stream: int, addr: int, value: int) -> None:
        d = self._d
        self._check(d.cuStreamWaitValue64(d.CUstream(stream), d.CUdeviceptr(addr), value,
                                          d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ),
                    "cuStreamWaitValue64")


class Ticket:
    """One gated run: ``future`` completes with the run; ``wait_on(stream)`` makes a
    stream wait for that, without blocking the host.

    ``holder`` (the run's Communicator, or None) is held while a stream waits on an
    unfinished run (``Communicator.hold_daemon``): its daemon must not quit then, since its
    relaunch could wait behind the application's blocking CUDA calls on that stream."""

    def __init__(self, gate, stamp: int, submit, holder=None):
        self._gate, self.stamp, self._submit, self._holder = gate, stamp, submit, holder
        self._held = False
        self.future: Future = Future()

    def wait_on(self, stream: int) -> None:
        with self._gate._cond:     # taken and released under the lock that ``_finish`` takes
            hold = (self._holder is not None and not self._held
                    and self.stamp in self._gate._unfinished)
            if hold:
                self._held = True
                self._holder.hold_daemon()
        if hold:
            self._holder.start_daemon()
        self._gate._ops.wait(stream, self._gate._done_addr + 8 * self._slot, self.stamp)

    @property
    def _slot(self) -> int:
        return (self.stamp - 1) % self._gate.nwords


class StreamGate:
    """Gated runs of one process: ``gate(stream, submit)`` returns a Ticket; ``submit()``
    (which returns a concurrent Future) is called on the watcher thread once the stream
    has reached the gate."""

    POLL_SECONDS = 20e-6

    def __init__(self, ops=None, nwords: int = 4096):
        self._ops = ops or DriverStreamOps()
        self.nwords = nwords
        self._ready, self._ready_addr = self._ops.mapped_words(nwords)
        self._done, self._done_addr = self._ops.mapped_words(nwords)
        self._stamp = 0
        self._waiting: list[Ticket] = []
        self._unfinished: set[int] = set()     # stamps whose done word is not written yet
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._watch, name="pydfccl-torch-gate",
                                        daemon=True)
        self._thread.start()

    def gate(self, stream: int, submit, holder=None) -> Ticket:
        with self._cond:
            # A slot is reused only once every older run is finished, or a stream waiting
            # for an old run would see a newer stamp in its slot.
            if self._unfinished and self._stamp + 1 - min(self._unfinished) >= self.nwords:
                raise RuntimeError(f"pydfccl.torch: {self.nwords} runs since the oldest "
                                   "unfinished one; its stream or its peers do not progress")
            self._stamp += 1
            self._unfinished.add(self._stamp)
            ticket = Ticket(self, self._stamp, submit, holder)
            self._ops.write(stream, self._ready_addr + 8 * ticket._slot, ticket.stamp)
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket

    def _watch(self) -> None:
        from .. import platform

        platform.bind_thread()      # submissions may touch the rank's GPU (a table write)
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                ready = [t for t in self._waiting if self._ready[t._slot] >= t.stamp]
                for t in ready:
                    self._waiting.remove(t)
            for t in ready:
                self._start(t)
            if not ready:
                time.sleep(self.POLL_SECONDS)

    def _start(self, ticket: Ticket) -> None:
        try:
            run = ticket._submit()
        except BaseException as exc:       # a submission error belongs to the ticket
            self._finish(ticket, None, exc)
            return
        run.add_done_callback(lambda f: self._finish(ticket, f.result() if not f.exception()
                                                     else None, f.exception()))

    def _finish(self, ticket: Ticket, result, error) -> None:
        # A failed run still releases the stream: the error is raised by wait() on the
        # host, and the stream must not wait forever on a word nobody will write.
        self._done[ticket._slot] = ticket.stamp
        with self._cond:
            self._unfinished.discard(ticket.stamp)
            if ticket._held:
                ticket._held = False
                ticket._holder.release_daemon()
        if error is not None:
            ticket.future.set_exception(error)
        else:
            ticket.future.set_result(result)
