"""pydfccl's own streams and copies on a GPU.

Never the legacy default stream: work the application queued there may be waiting for a
collective, and a daemon on a stream that synchronizes with it would block every other
launch on the device. pydfccl's own copies (pool writes and reads, ``copy_in``) go through
pinned memory on a stream of their own (a *staging*, one per copy in progress), so that
each is one DMA waited for on that stream alone, rather than a copy the driver stages
through buffers of its own, and copies of different threads do not wait for each other.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import numpy as np
from numba import cuda

from .driver import driver_result

__all__ = ["StreamWriteOps", "new_stream", "destroy_stream", "host_to_device",
           "device_to_host", "zero_device", "zero_rows", "memset_words", "STAGING_BYTES"]


def new_stream():
    """A non-blocking stream of the current device."""
    from cuda.bindings import driver

    cuda.current_context()
    handle = driver_result(driver.cuStreamCreate(
        driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
    stream = cuda.external_stream(int(handle))
    stream._pydfccl_handle = handle  # keep the driver handle alive with the stream
    return stream


def destroy_stream(stream) -> None:
    """Give back a stream from ``new_stream`` once nothing runs on it (a job that makes many
    communicators would otherwise leak one per communicator)."""
    if stream is None:
        return
    from cuda.bindings import driver

    stream.synchronize()
    driver.cuStreamDestroy(stream._pydfccl_handle)


STAGING_BYTES = 4 << 20
_idle: dict = {}                 # device -> stagings that no copy uses now
_idle_lock = threading.Lock()


def _current_device() -> int:
    """The calling thread's device: one driver call where the thread has a context (every
    copy of a rank thread), Numba's lookup (which makes the context current) otherwise."""
    from cuda.bindings import driver

    err, device = driver.cuCtxGetDevice()
    if int(err) == 0:
        return int(device)
    return cuda.get_current_device().id


@contextlib.contextmanager
def _staging():
    """A pinned buffer and a stream of the current device, for one copy at a time: a copy
    never waits behind another thread's (ranks that are threads of one process fill and
    read their buffers at once; a network proxy writes received slots while its rank
    fills), and a wait on the stream waits for this copy alone. The process keeps as many
    as it ever made copies at once."""
    device = _current_device()
    with _idle_lock:
        idle = _idle.setdefault(device, [])
        staging = idle.pop() if idle else None
    if staging is None:
        staging = (cuda.pinned_array(STAGING_BYTES, np.uint8), new_stream())
    try:
        yield staging
    finally:
        with _idle_lock:
            _idle[device].append(staging)


def host_to_device(addr: int, raw: np.ndarray) -> None:
    """Copy the flat uint8 ``raw`` to the device address ``addr`` and wait. The caller
    passes an address rather than a Numba array: each Numba view or slice made for a copy
    costs tens of microseconds of Python under the GIL, which ranks that are threads of one
    process take in turns."""
    from cuda.bindings import driver

    with _staging() as (pinned, stream):
        handle = stream._pydfccl_handle
        for start in range(0, raw.size, STAGING_BYTES):
            n = min(STAGING_BYTES, raw.size - start)
            pinned[:n] = raw[start:start + n]
            driver_result(driver.cuMemcpyHtoDAsync(addr + start, pinned.ctypes.data, n,
                                                   handle), "cuMemcpyHtoDAsync")
            driver_result(driver.cuStreamSynchronize(handle), "cuStreamSynchronize")


def device_to_host(addr: int, nbytes: int) -> np.ndarray:
    """A host copy (flat uint8) of ``nbytes`` at the device address ``addr``."""
    from cuda.bindings import driver

    out = np.empty(nbytes, np.uint8)
    with _staging() as (pinned, stream):
        handle = stream._pydfccl_handle
        for start in range(0, nbytes, STAGING_BYTES):
            n = min(STAGING_BYTES, nbytes - start)
            driver_result(driver.cuMemcpyDtoHAsync(pinned.ctypes.data, addr + start, n,
                                                   handle), "cuMemcpyDtoHAsync")
            driver_result(driver.cuStreamSynchronize(handle), "cuStreamSynchronize")
            out[start:start + n] = pinned[:n]
    return out


def zero_device(addr: int, nbytes: int) -> None:
    """Zero device memory on the device, on a staging stream, and wait: a pool of hundreds
    of MiB staged through pinned memory 4 MiB at a time would take a tenth of a second a
    rank."""
    from cuda.bindings import driver

    with _staging() as (_, stream):
        driver_result(driver.cuMemsetD8Async(addr, 0, nbytes, stream._pydfccl_handle),
                      "cuMemsetD8Async")
        stream.synchronize()


def zero_rows(addr: int, regions, write=None) -> None:
    """Zero each region ``(offset, pitch, width, rows)`` of the device memory at ``addr``
    (``rows`` runs of ``width`` bytes, ``pitch`` apart), then copy ``write`` (``(offset,
    flat uint8 array)``, at most STAGING_BYTES) there, on a staging stream, and wait once:
    a shared slot's reset is three strided regions and a table entry, and a synchronous copy
    a row made it hundreds of waits, each handing the GIL to the threads spinning on
    results."""
    from cuda.bindings import driver

    with _staging() as (pinned, stream):
        handle = stream._pydfccl_handle
        for offset, pitch, width, rows in regions:
            driver_result(driver.cuMemsetD2D8Async(addr + offset, pitch, 0, width, rows,
                                                   handle), "cuMemsetD2D8Async")
        if write is not None:
            offset, raw = write
            pinned[:raw.size] = raw
            driver_result(driver.cuMemcpyHtoDAsync(addr + offset, pinned.ctypes.data,
                                                   raw.size, handle), "cuMemcpyHtoDAsync")
        stream.synchronize()


def memset_words(addr: int, nbytes: int, pattern: int, itemsize: int) -> None:
    """Set every ``itemsize``-byte word (1, 2 or 4) of the ``nbytes`` at the device address
    ``addr`` to ``pattern``, on a staging stream, and wait."""
    from cuda.bindings import driver

    setter = {1: driver.cuMemsetD8Async, 2: driver.cuMemsetD16Async,
              4: driver.cuMemsetD32Async}[itemsize]
    with _staging() as (_, stream):
        driver_result(setter(addr, pattern, nbytes // itemsize, stream._pydfccl_handle),
                      f"cuMemsetD{8 * itemsize}Async")
        stream.synchronize()


class StreamWriteOps:
    """The driver operations of the stream gate (``host.stream_gate``): words of mapped
    host memory, and a write of one of them queued on a stream."""

    def mapped_words(self, n: int) -> tuple[np.ndarray, int]:
        """``n`` zeroed int64 words of pinned host memory the GPU can reach: (host view,
        device address). Allocated once per gate and kept for the process's life."""
        from cuda.bindings import driver as d

        flags = d.CU_MEMHOSTALLOC_DEVICEMAP | d.CU_MEMHOSTALLOC_PORTABLE
        ptr = driver_result(d.cuMemHostAlloc(8 * n, flags), "cuMemHostAlloc")
        host = np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(int(ptr)))
        host[:] = 0
        dev = driver_result(d.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer")
        return host, int(dev)

    def write(self, stream: int, addr: int, value: int) -> None:
        """``value`` into the word at ``addr`` once ``stream`` reaches this point."""
        from cuda.bindings import driver as d

        flags = d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT
        driver_result(d.cuStreamWriteValue64(d.CUstream(stream), d.CUdeviceptr(addr), value,
                                             flags), "cuStreamWriteValue64")
