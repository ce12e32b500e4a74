"""The GPU backend: device memory, mapped pinned memory the host and the daemon share, and
launches queued on non-blocking streams."""

from __future__ import annotations

import time
import weakref

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.devicearray import DeviceNDArray

from .. import cuda_start, gpu_query
from ..log import logger
from ..protocol.codes import storage_dtype
from . import driver, streams
from .base import Backend
from .storage import NumbaStorage, host_bytes

__all__ = ["GpuBackend", "GpuDeviceBuffer", "GpuHostBuffer"]


def _address_of(array) -> int:
    if isinstance(array, np.ndarray) and not hasattr(array, "__cuda_array_interface__"):
        return int(array.ctypes.data)
    return int(array.__cuda_array_interface__["data"][0])


def _numba_address(dev) -> int:
    """A Numba device array's address, without building its ``__cuda_array_interface__``
    (a dictionary and a contiguity walk, for every copy)."""
    return int(dev.device_ctypes_pointer.value or 0)


class GpuDeviceBuffer:
    """Zeroed device memory of ``nbytes``, with ``addr`` for the daemon and ``write`` and
    ``read`` for the host. ``host_view`` is the simulator's; a GPU refuses it."""

    def __init__(self, nbytes: int, host_view: np.ndarray | None = None):
        if host_view is not None:
            raise RuntimeError("device memory in a host view is for the simulator only")
        self.nbytes = nbytes
        self._dev = cuda.device_array(nbytes, np.uint8)
        self.addr = _address_of(self._dev)
        streams.zero_device(self.addr, nbytes)

    def write(self, offset: int, data: np.ndarray) -> None:
        """Copy ``data`` in and wait for it, on pydfccl's copy streams: a copy on the legacy
        default stream would wait for whatever the application queued there, which may
        itself be waiting for a collective (a collective prepared while others run)."""
        raw = host_bytes(data)
        self._check_span(offset, raw.size)
        streams.host_to_device(self.addr + offset, raw)

    def zero_rows(self, regions, write=None) -> None:
        """Zero each ``(offset, pitch, width, rows)`` region, then copy ``write`` (``(offset,
        data)``) in, with one wait for all of it."""
        if write is not None:
            offset, data = write
            write = (offset, host_bytes(data))
        streams.zero_rows(self.addr, regions, write)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """Copy bytes out (the trace drain reads the event rings with this), through pinned
        memory on pydfccl's copy streams."""
        self._check_span(offset, nbytes)
        return streams.device_to_host(self.addr + offset, nbytes)

    def _check_span(self, offset: int, nbytes: int) -> None:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"bytes {offset}..{offset + nbytes} of a buffer of "
                             f"{self.nbytes}")


class GpuHostBuffer:
    """Zeroed mapped pinned memory that both the host and the daemon read and write while it
    runs. ``array`` is its numpy view, ``addr`` the daemon's.

    ``host_view``: memory the caller provides and has zeroed, such as a shared-memory
    segment that other rank processes map too; it is registered with the driver
    (page-locked and mapped for the device) until this buffer is collected."""

    def __init__(self, nbytes: int, host_view: np.ndarray | None = None):
        if host_view is not None:
            self.array = host_view
            self.addr = driver.register_host(host_view)
            weakref.finalize(self, driver.unregister_host, int(host_view.ctypes.data))
        else:
            self._mapped = cuda.mapped_array(nbytes, dtype=np.uint8)
            self.array = np.ndarray.view(self._mapped, np.ndarray)
            self.addr = _address_of(self._mapped)
            self.array[...] = 0


class GpuBackend(Backend):
    name = "gpu"
    watchdog_seconds = 20.0
    # A small collective takes microseconds, and a millisecond of spinning covers it without
    # taking the cores that launcher threads need when many ranks wait at once.
    waiter_spin_seconds = 1e-3
    numba_device_array = DeviceNDArray
    DeviceBuffer = GpuDeviceBuffer
    HostBuffer = GpuHostBuffer
    # pydfccl arrays: copies and fills on pydfccl's copy streams, waited for
    array_storage = NumbaStorage(cuda.device_array, _numba_address, streams.host_to_device,
                                 streams.device_to_host, streams.memset_words)
    new_stream = staticmethod(streams.new_stream)
    destroy_stream = staticmethod(streams.destroy_stream)
    # %globaltimer follows the host's real-time clock, but apart by up to milliseconds,
    # which ``trace.clock_offset_ns`` measures and ``trace.on_daemon_clock`` takes off.
    event_clock_ns = staticmethod(time.time_ns)

    def gpu_available(self) -> bool:
        try:
            return bool(cuda.is_available())
        except Exception:  # a broken driver install is "no GPU", not a crash
            return False

    def address_of(self, array) -> int:
        """The address the daemon uses for ``array`` (its device pointer)."""
        return _address_of(array)

    def stream_write_ops(self):
        return streams.StreamWriteOps()

    def open_context(self) -> None:
        """Make the context, or take the one ``cuda_start.begin`` made, and let go of that
        module's hold on it."""
        cuda.current_context()
        cuda_start.settle()

    def bind_thread(self) -> None:
        """In a thread pydfccl starts (launcher, poller): use the process's device. A CUDA
        context is current per thread, and a new thread would otherwise take GPU 0's."""
        device = gpu_query.process_device()
        if device is not None:
            cuda.select_device(device)

    def multiprocessors(self) -> int | None:
        """The streaming multiprocessors of the process's GPU, or None without one."""
        return gpu_query.multiprocessors()

    def device_memory_used(self) -> int | None:
        """Bytes of the GPU's memory in use (every process's)."""
        if not self.gpu_available():
            return None
        free, total = cuda.current_context().get_memory_info()
        return total - free

    def flush_frees(self) -> int:
        """Make the device frees Numba has queued (see ``deferred_frees``) and return how
        many there were, so that a reading of the device's memory counts what is really
        held. Does nothing while some thread holds frees back."""
        if not self.gpu_available():
            return 0
        pending = cuda.current_context().deallocations
        count = len(pending)
        pending.clear()
        return count

    def clear_layout_cache(self) -> int:
        """Empty numba-cuda's cache of array layouts and return how many it held. Numba
        keeps one entry (a few small objects) per distinct (offset, shape, strides,
        itemsize) ever made, without bound (``dummyarray.Array.from_desc``, a
        ``functools.cache``): a program that makes arrays of ever new sizes grows by it."""
        from numba.cuda.cudadrv.dummyarray import Array

        cached = Array.from_desc.__func__
        held = cached.cache_info().currsize
        cached.cache_clear()
        return held

    def empty(self, count: int, dtype) -> object:
        """A user buffer on this rank's device. Numba cannot allocate bfloat16, so a
        bfloat16 buffer is a uint16 array of raw bits."""
        return cuda.device_array(count, storage_dtype(dtype))

    def _copy_out(self, dev) -> np.ndarray:
        """On pydfccl's copy streams, not ordered with the application's streams."""
        if dev.is_c_contiguous():
            return streams.device_to_host(_numba_address(dev), dev.size * dev.dtype.itemsize
                                          ).view(dev.dtype).reshape(dev.shape)
        return dev.copy_to_host()

    def _copy_to_device(self, dst, values: np.ndarray) -> None:
        """Waited for: Numba's copy from pageable memory returns before its DMA has landed,
        and the daemon (on another stream) could read the buffer, or write its result,
        first (one wrong soak result in 15,000 on the H200)."""
        dev = dst if hasattr(dst, "copy_to_host") else cuda.as_cuda_array(dst, sync=False)
        if dev.shape != values.shape and dev.size == values.size:
            values = values.reshape(dev.shape)
        if dev.shape != values.shape or dev.dtype != values.dtype:
            raise ValueError(f"copy_in: {values.dtype} values of shape {values.shape} into a "
                             f"{dev.dtype} buffer of shape {dev.shape}")
        if not dev.is_c_contiguous():
            raise ValueError("copy_in: the buffer is not C-contiguous")
        streams.host_to_device(_numba_address(dev), host_bytes(values))

    def shipped_daemon(self, policy, registers: int):
        """The shipped cubin for this GPU's compute capability, loaded; None where there is
        none for it or the driver refuses it (then the daemon is compiled)."""
        from ..kernels.shipped import find_shipped
        from .cubin import CubinKernel

        cuda.current_context()
        cc = (driver.device_attribute("COMPUTE_CAPABILITY_MAJOR"),
              driver.device_attribute("COMPUTE_CAPABILITY_MINOR"))
        found = find_shipped(policy, registers, cc)
        if found is None:
            return None
        kernel = CubinKernel(found.image(), found.entry, found.nargs, f"{policy.name}'s daemon")
        try:
            kernel.load()
        except RuntimeError as exc:
            logger.info("the shipped daemon %s was not loaded (%s): compiling it", found.file,
                        exc)
            return None
        return kernel

    def configure_launch(self, kernel, nblocks: int, nthreads: int, stream):
        """``kernel`` configured once for its grid and ``stream``, for ``launch`` and
        ``launch_ahead``. Configured at every launch instead, Numba wraps the stream in a
        cuda.core ``Stream`` each time, and ``Stream.from_handle`` defines a class per call
        (19 to 36 us a call, and the classes pile up)."""
        from cuda.core import Stream as CoreStream

        from .cubin import CubinKernel

        if isinstance(kernel, CubinKernel):
            return kernel.configure(nblocks, nthreads, int(stream.handle))
        return kernel[nblocks, nthreads, CoreStream.from_handle(int(stream.handle))]

    def launch(self, configured, args) -> None:
        """Queue a launch of a ``configure_launch`` kernel on its stream."""
        configured(*args)

    def launch_ahead(self, configured, args) -> bool:
        """Queue a launch of a ``configure_launch`` kernel from the calling thread without
        waiting for it; True: launched."""
        self.bind_thread()     # the caller's thread may not be one of pydfccl's
        configured(*args)
        return True

    def synchronize_device(self) -> None:
        """A device-wide synchronize: returns once every kernel on the device has ended."""
        cuda.synchronize()
