"""The handle of one collective on torch tensors, as torch.distributed's ``Work``."""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["Work"]


class Work(dist.Work):
    """``wait()``: on CUDA, makes the caller's current stream wait for the collective
    (the host goes on at once); on CPU (simulator), returns when it has completed.
    ``get_future()``: a ``torch.futures.Future`` of the output tensors, completed on the
    host when the collective completes. Errors (mismatch across ranks, deadlock, abort)
    raise from either."""

    def __init__(self, future, outputs: list, ticket=None, device=None):
        super().__init__()
        self._future = future          # concurrent.futures.Future of the run
        self._outputs = outputs
        self._ticket = ticket          # CUDA: the stream gate's ticket
        self._device = device
        self._torch_future = None

    def wait(self, timeout=None) -> bool:
        if self._ticket is not None:
            if self._future.done() and self._future.exception() is not None:
                raise self._future.exception()
            stream = torch.cuda.current_stream(self._device).cuda_stream
            with torch.cuda.device(self._device):
                self._ticket.wait_on(stream)
            return True
        seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
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
