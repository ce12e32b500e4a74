"""What a failed run leaves in its recv buffer: NaN where the buffer holds floats in host
memory, so that code that ignores the error cannot take the unreduced data for a result.

The guarantee is the error itself: a failed run's future raises, and every later call on
the communicator raises the first error (``rankstate``). Poisoning is a second line for a
program that drops a future without asking it (an ``async_op`` whose ``wait()`` never
comes): a NaN propagates through whatever is computed from it. Only host memory (the
simulator's buffers, numpy arrays, CPU tensors' views) is filled, by the host thread that
fails the runs; device memory is left alone, since that thread must not queue device
work (``poller``), and its contents are undefined after a failure.
"""

from __future__ import annotations

import numpy as np

__all__ = ["poison"]


def poison(recv) -> bool:
    """Fill ``recv`` with NaN if it is a writable float array in host memory; whether it
    was filled. A ``pydfccl.Array`` is looked through to the memory it wraps."""
    if getattr(recv, "_pydfccl_array", False):
        recv = recv.raw
    if not isinstance(recv, np.ndarray) or recv.dtype.kind not in "fc":
        return False
    if not recv.flags.writeable:
        return False
    recv[...] = np.nan
    return True
