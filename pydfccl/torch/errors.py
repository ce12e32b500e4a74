"""pydfccl's failures as torch.distributed's error types, which training code catches
(``except torch.distributed.DistError``). Each keeps pydfccl's detail (the message and the
original exception as ``cause``) and names the rank that saw it; being also a
``PydfcclError``, code written against pydfccl's own errors keeps working."""

from __future__ import annotations

import concurrent.futures

import torch.distributed as dist

from ..errors import PydfcclError

__all__ = ["DfcclError", "DfcclTimeoutError", "as_torch_error"]


class DfcclError(dist.DistBackendError, PydfcclError):
    """A collective of a dfccl group failed on ``rank``; ``cause`` is pydfccl's exception
    (a ``DeadlockError``, ``AbortedError``, a mismatch across ranks, ...)."""

    def __init__(self, message: str, rank: int | None = None,
                 cause: BaseException | None = None):
        super().__init__(message)
        self.rank, self.cause = rank, cause


class DfcclTimeoutError(DfcclError, TimeoutError):
    """A wait on a dfccl group outlasted its timeout (the group's ``timeout=``, or the one
    given to ``Work.wait``); the collective may still complete later."""


def as_torch_error(exc: BaseException, rank: int | None, what: str,
                   timeout: float | None = None, whose: str = "the wait's") -> BaseException:
    """``exc``, raised while waiting for ``what`` on ``rank``, as a torch error (an
    exception that already is one is returned as it is)."""
    if isinstance(exc, dist.DistError):
        return exc
    where = f"dfccl rank {rank}" if rank is not None else "dfccl"
    if isinstance(exc, (concurrent.futures.TimeoutError, TimeoutError)):
        return DfcclTimeoutError(f"{where}: {what} did not complete within {timeout:g} s "
                                 f"({whose} timeout)", rank, exc)
    detail = str(exc) or type(exc).__name__
    return DfcclError(f"{where}: {what} failed: {type(exc).__name__}: {detail}", rank, exc)
