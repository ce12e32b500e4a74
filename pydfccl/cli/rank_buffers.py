"""Filling and reading a rank's buffers in the commands' rank workers, with
``pydfccl.platform`` imported at the first call rather than with the command: a command's
own process that only starts rank processes never loads Numba's CUDA target, and one that
runs its ranks as threads loads it after ``launch`` has begun the CUDA context beside it."""

from __future__ import annotations

__all__ = ["copy_in", "to_numpy"]


def copy_in(dst, values) -> None:
    """``pydfccl.platform.copy_in``: ``values`` (a numpy array) into the buffer ``dst``."""
    from .. import platform

    platform.copy_in(dst, values)


def to_numpy(array, dtype=None):
    """``pydfccl.platform.to_numpy``: a host copy of a buffer, as ``dtype`` if given."""
    from .. import platform

    return platform.to_numpy(array, dtype)
