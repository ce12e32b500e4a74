"""The handle of one collective on torch tensors, as torch.distributed's ``Work``."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["Work"]


class Work(dist.Work):
    """``wait()`` returns once the collective has completed, on CPU and CUDA tensors alike:
    the host waits, and kernels queued after it see the result. No stream ever waits for a
    collective on the GPU (``streams.py`` says why). ``get_future()``: a
    ``torch.futures.Future`` of the output tensors, completed on the host when the
    collective completes. Errors (mismatch across ranks, deadlock, abort) raise from
    either."""

    def __init__(self, future, outputs: list):
        super().__init__()
        self._future = future          # concurrent.futures.Future of the run
        self._outputs = outputs
        self._torch_future = None

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        self._future.result(timeout=seconds or None)
        return True

    def is_completed(self) -> bool:
        return self._future.done()

    def is_success(self) -> bool:
        return self._future.done() and self._future.exception() is None

    def exception(self):
        return self._future.exception() if self._future.done() else None

    def result(self) -> list:
        self.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        if self._torch_future is None:
            fut = torch.futures.Future()

            def done(f):
                if f.exception() is not None:
                    fut.set_exception(f.exception())
                else:
                    fut.set_result(self._outputs)

            self._torch_future = fut
            self._future.add_done_callback(done)
        return self._torch_future
