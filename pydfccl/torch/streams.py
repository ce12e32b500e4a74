"""Starting pydfccl runs when a CUDA stream reaches them, without blocking the host.

A gated run j gets a ``ready`` word in mapped host memory (slot j % N; stamps grow, so a
slot is reused safely). ``cuStreamWriteValue64`` on the caller's stream writes
``ready = j + 1`` once the work queued before it has finished (the driver flushes that
work's writes first, so the inputs are visible), and a watcher thread submits the run when
it sees the word.

Nothing on the GPU ever waits for a run: its result is waited for on the host
(``Ticket.future``). A stream that waited for a collective on the GPU
(``cuStreamWaitValue``) would be a wait that no daemon quit can end: a device-wide wait
queued behind it (``torch.cuda.synchronize()``, a synchronous copy, a lazy module load,
``cuMemFree``) then needs the collective, the collective needs the daemons of every rank,
and a daemon that has quit needs a relaunch, which such a wait can hold up. That cycle
stalled a 4-rank training job on one GPU; see docs/design.md, "Streams".

All CUDA driver calls are in ``DriverStreamOps``; tests pass a stand-in with the same
two methods.
"""

from __future__ import annotations

import ctypes
import threading
import time
from concurrent.futures import Future

import numpy as np

__all__ = ["DriverStreamOps", "StreamGate", "Ticket"]


class DriverStreamOps:
    """The two driver operations the gate needs, through cuda-python."""

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


class Ticket:
    """One gated run: ``future`` completes with the run (its result or its error)."""

    def __init__(self, gate, stamp: int, submit):
        self._gate, self.stamp, self._submit = gate, stamp, submit
        self.future: Future = Future()

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
        self._stamp = 0
        self._waiting: list[Ticket] = []       # written on their streams, not yet seen
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._watch, name="pydfccl-torch-gate",
                                        daemon=True)
        self._thread.start()

    def gate(self, stream: int, submit) -> Ticket:
        with self._cond:
            # A slot is reused only once its previous ticket has been seen, or that
            # ticket's stream would write over the newer stamp.
            if self._waiting and self._stamp + 1 - self._waiting[0].stamp >= self.nwords:
                raise RuntimeError(f"pydfccl.torch: {self.nwords} runs since the oldest one "
                                   "whose stream has not reached it; that stream does not "
                                   "progress")
            self._stamp += 1
            ticket = Ticket(self, self._stamp, submit)
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

    @staticmethod
    def _start(ticket: Ticket) -> None:
        try:
            run = ticket._submit()
        except BaseException as exc:       # a submission error belongs to the ticket
            ticket.future.set_exception(exc)
            return
        run.add_done_callback(lambda f: _settle(ticket.future, f))


def _settle(future: Future, run: Future) -> None:
    """Give ``future`` the outcome of the finished ``run``."""
    error = run.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(run.result())
