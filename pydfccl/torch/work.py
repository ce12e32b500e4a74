"""The handle of one collective on torch tensors, as torch.distributed's ``Work``."""

from __future__ import annotations

from concurrent.futures import Future
from datetime import timedelta

import torch
import torch.distributed as dist

from .errors import DfcclTimeoutError, as_torch_error

__all__ = ["Work", "completed_work"]


def _seconds(timeout) -> float | None:
    """A timeout as seconds; None, zero or negative (torch's "unset") as no timeout."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    return seconds if seconds is not None and seconds > 0 else None


class Work(dist.Work):
    """``wait()`` returns once the collective has completed, on CPU and CUDA tensors alike:
    the host waits, and kernels queued after it see the result. No stream ever waits for a
    collective on the GPU (``host/stream_gate.py`` says why). ``get_future()``: a
    ``torch.futures.Future`` of the output tensors, completed on the host when the
    collective completes.

    ``wait(timeout)`` waits at most ``timeout`` (default: the group's timeout, torch's 30
    minutes unless ``init_process_group``/``new_group`` said otherwise); errors (mismatch
    across ranks, deadlock, abort, the timeout) raise as ``DfcclError``, a
    ``torch.distributed.DistBackendError`` naming the rank and the collective."""

    def __init__(self, future, outputs: list, *, timeout=None, rank: int | None = None,
                 what: str = "a collective", on_group_timeout=None, on_failure=None):
        super().__init__()
        self._on_group_timeout = on_group_timeout   # the group's timeout fails the group
        self._on_failure = on_failure    # so does a failed run, before wait() raises it
        self._future = future          # concurrent.futures.Future of the run
        self._outputs = outputs
        self._torch_future = None
        self._timeout, self._rank, self._what = _seconds(timeout), rank, what

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        own = timeout is not None
        seconds = _seconds(timeout) if own else self._timeout
        try:
            self._future.result(timeout=seconds)
        except BaseException as exc:
            error = as_torch_error(exc, self._rank, self._what, seconds,
                                   "the wait's" if own else "the group's")
            if isinstance(error, DfcclTimeoutError):
                if not own and self._on_group_timeout:
                    self._on_group_timeout(error)
            elif self._on_failure is not None:
                # the future's done callbacks run after its waiters wake: without this,
                # the caller's next collective could be submitted before the group knew
                self._on_failure(exc)
            raise error from exc
        return True

    @property
    def timeout(self) -> float | None:
        """The group's timeout for ``wait()`` (seconds; None: none)."""
        return self._timeout

    @property
    def what(self) -> str:
        return self._what

    @property
    def on_group_timeout(self):
        return self._on_group_timeout

    def _torch_error(self, exc):
        return as_torch_error(exc, self._rank, self._what)

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self):
        if not self._future.done() or self._future.exception() is None:
            return None
        return self._torch_error(self._future.exception())

    def result(self) -> list:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        if self._torch_future is None:
            fut = torch.futures.Future()

            def done(f):
                if f.exception() is not None:
                    fut.set_exception(self._torch_error(f.exception()))
                else:
                    fut.set_result(self._outputs)

            self._torch_future = fut
            self._future.add_done_callback(done)
        return self._torch_future


def completed_work(outputs: list, rank: int | None = None, what: str = "a collective") -> Work:
    """A Work that has completed already (a no-op: numel-0 tensors, a collective finished
    synchronously)."""
    future = Future()
    future.set_result(outputs)
    return Work(future, outputs, rank=rank, what=what)
