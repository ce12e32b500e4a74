"""Host-side portability: the few host operations that differ between a GPU and the
CUDA simulator (allocation, addresses, streams, launching, synchronizing).

Under the simulator (``NUMBA_ENABLE_CUDASIM=1``) "device" memory is ordinary host memory
(optionally shared between rank processes) and a kernel launch runs to completion on the
calling thread; on a GPU, launches are asynchronous on a non-blocking stream. The
communicator is written against this module only.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import time
import weakref

import numpy as np
from numba import cuda

from ..protocol.codes import BFLOAT16, storage_dtype
from ..kernels.memory import SIMULATOR

# A daemon deliberately uses a few blocks; Numba's low-occupancy warning would fire on every
# launch.
cuda.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

# The class of Numba's device arrays (None under the simulator, whose arrays are numpy's).
if SIMULATOR:
    NUMBA_DEVICE_ARRAY = None
else:
    from numba.cuda.cudadrv.devicearray import DeviceNDArray as NUMBA_DEVICE_ARRAY

__all__ = ["SIMULATOR", "WAIT_SPIN_SECONDS", "event_clock_ns", "gpu_available",
           "DeviceBuffer", "HostBuffer", "PeerBuffer", "ipc_handle", "use_device",
           "bind_thread", "mps_active", "device_attribute", "device_memory_used",
           "multiprocessors", "driver_result", "address_of", "empty", "new_stream",
           "destroy_stream", "launch", "launch_ahead",
           "wait_stream", "synchronize_device", "deferred_frees", "to_numpy", "copy_in",
           "precise_sleeps", "NUMBA_DEVICE_ARRAY", "clear_layout_cache"]


# How long a thread in ``Future.result()`` watches for its completion itself (spinning
# without the GIL, a core each) before it leaves that to the poller thread and sleeps. On a
# GPU a small collective takes microseconds, and a millisecond of spinning covers it without
# taking the cores that launcher threads need when many ranks wait at once; under the
# simulator a collective takes milliseconds of CPU that a spinning waiter would only slow.
WAIT_SPIN_SECONDS = 0.0 if SIMULATOR else 1e-3

# Now, on the clock of the daemons' event logs, read on the host: the simulator's device
# clock is perf_counter_ns; a GPU's %globaltimer follows the host's real-time clock, but
# apart by up to milliseconds (330 us on the H200, 2026-11-30 15:32), which
# ``trace.clock_offset_ns`` measures and ``trace.on_daemon_clock`` takes off.
event_clock_ns = time.perf_counter_ns if SIMULATOR else time.time_ns


def gpu_available() -> bool:
    if SIMULATOR:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:  # a broken driver install is "no GPU", not a crash
        return False


def address_of(array) -> int:
    """The address the daemon uses for ``array`` (device pointer, or host pointer in the
    simulator)."""
    if SIMULATOR or (isinstance(array, np.ndarray)
                     and not hasattr(array, "__cuda_array_interface__")):
        return int(array.ctypes.data)
    return int(array.__cuda_array_interface__["data"][0])


class DeviceBuffer:
    """Zeroed device memory of ``nbytes`` (under the simulator: host memory, or a view of
    memory the caller provides and has zeroed, such as a shared-memory segment), with
    ``addr`` for the daemon and ``write``/``read`` for the host."""

    def __init__(self, nbytes: int, host_view: np.ndarray | None = None):
        self.nbytes = nbytes
        if SIMULATOR:
            self._host = host_view if host_view is not None else np.zeros(nbytes, np.uint8)
            self.addr = int(self._host.ctypes.data)
        else:
            self._dev = cuda.device_array(nbytes, np.uint8)
            self.addr = address_of(self._dev)
            _zero_device(self.addr, nbytes)

    def write(self, offset: int, data: np.ndarray) -> None:
        """Copy ``data`` in and wait for it. The copy goes on a stream of its own: one on the
        legacy default stream would wait for whatever the application queued there, which
        may itself be waiting for a collective (a collective prepared while others run)."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if SIMULATOR:
            self._host[offset:offset + raw.size] = raw
        else:
            _host_to_device(self._dev[offset:offset + raw.size], raw)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        """Copy bytes out (the poller reads the trace rings with this), through pinned
        memory on pydfccl's copy stream: see ``_host_to_device``."""
        if SIMULATOR:
            return self._host[offset:offset + nbytes].copy()
        return _device_to_host(self._dev[offset:offset + nbytes])


class HostBuffer:
    """Zeroed memory that both the host and the daemon read and write while it runs
    (mapped pinned memory on a GPU). ``array`` is its numpy view, ``addr`` the daemon's.

    ``host_view``: memory the caller provides and has zeroed, such as a shared-memory
    segment that other rank processes map too; on a GPU it is registered with the driver
    (page-locked and mapped for the device) until this buffer is collected."""

    def __init__(self, nbytes: int, host_view: np.ndarray | None = None):
        if SIMULATOR:
            self.array = host_view if host_view is not None else np.zeros(nbytes, np.uint8)
            self.addr = address_of(self.array)
        elif host_view is not None:
            self.array = host_view
            self.addr = _register_host(host_view)
            weakref.finalize(self, _unregister_host, int(host_view.ctypes.data))
        else:
            self._mapped = cuda.mapped_array(nbytes, dtype=np.uint8)
            self.array = np.ndarray.view(self._mapped, np.ndarray)
            self.addr = address_of(self._mapped)
        if host_view is None:
            self.array[...] = 0


# -- memory shared between rank processes on GPUs (CUDA IPC) -------------------------------------

def driver_result(result, what: str):
    """cuda-python calls return (error, values...): raise on an error, else the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


def _register_host(view: np.ndarray) -> int:
    from cuda.bindings import driver

    cuda.current_context()
    ptr = int(view.ctypes.data)
    driver_result(driver.cuMemHostRegister(ptr, view.nbytes, driver.CU_MEMHOSTREGISTER_PORTABLE
                                    | driver.CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
    return int(driver_result(driver.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer"))


def _unregister_host(ptr: int) -> None:
    from cuda.bindings import driver

    driver.cuMemHostUnregister(ptr)


IPC_HANDLE_BYTES = 64


def ipc_handle(buffer: DeviceBuffer) -> bytes:
    """The CUDA IPC handle of ``buffer``'s allocation, as bytes another process can open."""
    from cuda.bindings import driver

    handle = driver_result(driver.cuIpcGetMemHandle(buffer.addr), "cuIpcGetMemHandle")
    return ctypes.string_at(handle.getPtr(), IPC_HANDLE_BYTES)


class PeerBuffer:
    """Another rank process's ``DeviceBuffer``, opened from its ``ipc_handle`` (on another
    GPU of this host too: peer access is enabled as the handle is opened). ``addr`` is where
    this process's daemon reaches it. It is not opened through Numba's ``IpcHandle``, which
    falls back to a one-time copy when the devices cannot reach each other."""

    def __init__(self, handle: bytes):
        from cuda.bindings import driver

        cuda.current_context()
        raw = driver.CUipcMemHandle()
        ctypes.memmove(raw.getPtr(), handle, IPC_HANDLE_BYTES)
        ptr = driver_result(driver.cuIpcOpenMemHandle(
            raw, driver.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.value),
            "cuIpcOpenMemHandle")
        self.addr = int(ptr)
        weakref.finalize(self, driver.cuIpcCloseMemHandle, ptr)


_process_device: int | None = None    # set by use_device; threads pydfccl starts follow it


def use_device(index: int) -> int:
    """Make GPU ``index`` (modulo the GPUs present) this process's device; returns it. Rank
    processes of one host spread over its GPUs by their local rank."""
    global _process_device
    _process_device = index % len(cuda.gpus)
    cuda.select_device(_process_device)
    return _process_device


def bind_thread() -> None:
    """In a thread pydfccl starts (launcher, poller): use the process's device. A CUDA
    context is current per thread, and a new thread would otherwise take GPU 0's."""
    if _process_device is not None and not SIMULATOR:
        cuda.select_device(_process_device)


def device_attribute(name: str) -> int:
    """The driver's ``CU_DEVICE_ATTRIBUTE_<name>`` of the current thread's GPU."""
    from cuda.bindings import driver

    cuda.current_context()
    device = driver_result(driver.cuCtxGetDevice(), "cuCtxGetDevice")
    return int(driver_result(driver.cuDeviceGetAttribute(
        getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), device),
        f"cuDeviceGetAttribute({name})"))


def multiprocessors() -> int | None:
    """The streaming multiprocessors of the process's GPU (GPU 0 until ``use_device``), or
    None without one or without a driver that answers. Read through the driver without
    making a context, so that a launcher that only sizes a world takes no GPU memory."""
    if not gpu_available():
        return None
    try:
        from cuda.bindings import driver

        driver_result(driver.cuInit(0), "cuInit")
        device = driver_result(driver.cuDeviceGet(_process_device or 0), "cuDeviceGet")
        return int(driver_result(driver.cuDeviceGetAttribute(
            driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
            "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"))
    except RuntimeError:   # the driver's errors (driver_result), a driver library not found
        return None


def device_memory_used() -> int | None:
    """Bytes of the GPU's memory in use (every process's), or None under the simulator."""
    if SIMULATOR or not gpu_available():
        return None
    free, total = cuda.current_context().get_memory_info()
    return total - free


def flush_frees() -> int:
    """Make the device frees Numba has queued (see ``deferred_frees``) and return how many
    there were, so that a reading of the device's memory counts what is really held. Does
    nothing while some thread holds frees back."""
    if SIMULATOR or not gpu_available():
        return 0
    pending = cuda.current_context().deallocations
    count = len(pending)
    pending.clear()
    return count


def mps_active() -> bool:
    """Whether this process's context is shared through the MPS daemon: without it, kernels
    of rank processes that share one GPU take turns in time slices of milliseconds."""
    return bool(device_attribute("MPS_ENABLED"))


def empty(count: int, dtype) -> object:
    """A user buffer on this rank's device (numpy under the simulator). Numba cannot
    allocate bfloat16, so on the GPU a bfloat16 buffer is a uint16 array of raw bits."""
    if SIMULATOR:
        return np.empty(count, dtype)
    return cuda.device_array(count, storage_dtype(dtype))


def to_numpy(array, dtype=None) -> np.ndarray:
    """A host copy of ``array`` (under the simulator, the array itself); with ``dtype``
    bfloat16, a uint16 array of raw bits comes back as bfloat16 values. On a GPU the copy
    goes on pydfccl's copy stream, not ordered with the application's streams."""
    if isinstance(array, np.ndarray) and not hasattr(array, "copy_to_host"):
        host = array
    else:
        dev = array if hasattr(array, "copy_to_host") else cuda.as_cuda_array(array, sync=False)
        if not SIMULATOR and dev.is_c_contiguous():
            host = _device_to_host(_flat_bytes(dev)).view(dev.dtype).reshape(dev.shape)
        else:
            host = dev.copy_to_host()
    if dtype is not None and np.dtype(dtype) == BFLOAT16 and host.dtype == np.uint16:
        return host.view(BFLOAT16)
    return host


def copy_in(dst, values: np.ndarray) -> None:
    """Write host ``values`` into the user buffer ``dst`` (bfloat16 values go into a uint16
    buffer as their bits)."""
    values = np.ascontiguousarray(values)
    if values.dtype == BFLOAT16 and dst.dtype == np.uint16:
        values = values.view(np.uint16)
    if isinstance(dst, np.ndarray):
        dst[...] = values
    elif SIMULATOR:
        dst.copy_to_device(values)
    else:
        # Waited for: Numba's copy from pageable memory returns before its DMA has landed,
        # and the daemon (on another stream) could read the buffer, or write its result,
        # first. That race cost one wrong soak result in 15,000 on the H200
        # (``gpu_check.sh soak``, 2026-11-29).
        dev = dst if hasattr(dst, "copy_to_host") else cuda.as_cuda_array(dst, sync=False)
        if dev.shape != values.shape and dev.size == values.size:
            values = values.reshape(dev.shape)
        if dev.shape != values.shape or dev.dtype != values.dtype:
            raise ValueError(f"copy_in: {values.dtype} values of shape {values.shape} into a "
                             f"{dev.dtype} buffer of shape {dev.shape}")
        _host_to_device(_flat_bytes(dev), values.view(np.uint8).reshape(-1))


def _flat_bytes(dev):
    """A C-contiguous Numba device array as a flat uint8 one (the same memory)."""
    if not dev.is_c_contiguous():
        raise ValueError("pydfccl copies need a C-contiguous device array")
    return dev.reshape(dev.size).view(np.uint8)


STAGING_BYTES = 4 << 20
_staging: dict = {}


def _staged():
    """(pinned host buffer, lock, copy stream) of the current device. pydfccl's own copies go
    through pinned memory, so that each is one DMA on pydfccl's stream, waited for on that
    stream alone, rather than a copy the driver stages through buffers of its own. (This did
    not cure the torch stall it was first written for, 2026-11-29: there a pinned copy
    waited just as a pageable one had; see ``progress`` and ``Communicator.hold_daemon``.)"""
    device = cuda.get_current_device().id
    with _copy_streams_lock:
        if device not in _staging:
            _staging[device] = (cuda.pinned_array(STAGING_BYTES, np.uint8), threading.Lock())
    return (*_staging[device], _copy_stream())


def _host_to_device(dev_bytes, raw: np.ndarray) -> None:
    """Copy the flat uint8 ``raw`` into the flat uint8 device array ``dev_bytes`` and wait."""
    pinned, lock, stream = _staged()
    with lock:
        for start in range(0, raw.size, STAGING_BYTES):
            n = min(STAGING_BYTES, raw.size - start)
            pinned[:n] = raw[start:start + n]
            dev_bytes[start:start + n].copy_to_device(pinned[:n], stream=stream)
            stream.synchronize()


def _zero_device(addr: int, nbytes: int) -> None:
    """Zero device memory on the device, on pydfccl's copy stream, and wait: a pool of
    hundreds of MiB staged through pinned memory 4 MiB at a time would take a tenth of a
    second a rank."""
    from cuda.bindings import driver

    stream = _copy_stream()
    driver_result(driver.cuMemsetD8Async(addr, 0, nbytes, stream._pydfccl_handle),
                  "cuMemsetD8Async")
    stream.synchronize()


def _device_to_host(dev_bytes) -> np.ndarray:
    """A host copy of the flat uint8 device array ``dev_bytes``."""
    pinned, lock, stream = _staged()
    out = np.empty(dev_bytes.size, np.uint8)
    with lock:
        for start in range(0, out.size, STAGING_BYTES):
            n = min(STAGING_BYTES, out.size - start)
            dev_bytes[start:start + n].copy_to_host(pinned[:n], stream=stream)
            stream.synchronize()
            out[start:start + n] = pinned[:n]
    return out


def clear_layout_cache() -> int:
    """Empty numba-cuda's cache of array layouts and return how many it held. Numba keeps
    one entry (a few small objects) per distinct (offset, shape, strides, itemsize) ever
    made, without bound (``dummyarray.Array.from_desc``, a ``functools.cache``): a program
    that makes arrays of ever new sizes, as the soak does, grows by it."""
    if SIMULATOR:
        return 0
    from numba.cuda.cudadrv.dummyarray import Array

    cached = Array.from_desc.__func__
    held = cached.cache_info().currsize
    cached.cache_clear()
    return held


def new_stream():
    """A non-blocking stream: a persistent daemon on a stream that synchronizes with the
    legacy default stream would block every other launch on the device."""
    if SIMULATOR:
        return None
    from cuda.bindings import driver

    cuda.current_context()
    handle = driver_result(driver.cuStreamCreate(
        driver.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
    stream = cuda.external_stream(int(handle))
    stream._pydfccl_handle = handle  # keep the driver handle alive with the stream
    return stream


_copy_streams: dict = {}
_copy_streams_lock = threading.Lock()


def _copy_stream():
    """This process's stream (one per device) for the copies pydfccl makes itself: pool
    writes and reads, and ``copy_in``. Never the legacy default stream, whose queued work
    may be waiting for a collective."""
    device = cuda.get_current_device().id
    with _copy_streams_lock:
        if device not in _copy_streams:
            _copy_streams[device] = new_stream()
        return _copy_streams[device]


def destroy_stream(stream) -> None:
    """Give back a stream from ``new_stream`` once nothing runs on it (a job that makes many
    communicators would otherwise leak one per communicator)."""
    if stream is None:
        return
    from cuda.bindings import driver

    stream.synchronize()
    driver.cuStreamDestroy(stream._pydfccl_handle)


# The simulator runs one kernel at a time per process (a launch made while another runs is
# taken for a device-function call): launches from several host threads take turns.
_simulated_launch = threading.Lock()


# A GPU launch returns once the kernel is queued on its stream; a simulated one runs the
# kernel to its end on the calling thread, so it is "on the stream" from the call on.
LAUNCHES_ARE_QUEUED = not SIMULATOR


def configure_launch(kernel, nblocks: int, nthreads: int, stream):
    """``kernel`` configured once for its grid and ``stream``, for ``launch`` and
    ``launch_ahead``. Configured at every launch instead, Numba wraps the stream in a
    cuda.core ``Stream`` each time, and ``Stream.from_handle`` defines a class per call:
    19 to 36 us a call on the development machine's CPU (2026-11-29), and the classes the GPU
    soak made."""
    if SIMULATOR:
        return kernel[nblocks, nthreads]
    from cuda.core import Stream as CoreStream

    return kernel[nblocks, nthreads, CoreStream.from_handle(int(stream.handle))]


def launch(configured, args) -> None:
    """Launch a ``configure_launch`` kernel; under the simulator this returns when the
    kernel has exited."""
    if SIMULATOR:
        with _simulated_launch:
            configured(*args)
    else:
        configured(*args)


def launch_ahead(configured, args) -> bool:
    """Queue a launch of a ``configure_launch`` kernel from the calling thread without
    waiting for it; False (nothing launched) under the simulator, where a launch runs on
    the calling thread."""
    if SIMULATOR:
        return False
    bind_thread()     # the caller's thread may not be one of pydfccl's
    configured(*args)
    return True


def wait_stream(stream) -> None:
    if stream is not None:
        stream.synchronize()


_frees_lock = threading.Lock()


@contextlib.contextmanager
def deferred_frees():
    """A context in which Numba queues device frees instead of making them. ``cuMemFree``
    may wait for every kernel on the device, and a kernel that never quits (a daemon under
    the ``nccl`` policy, stuck in a deadlock) would then stall the thread that freed. A
    thread completing futures enters it when a free could happen there (a dropped buffer, a
    done-callback), a daemon that never quits runs in it, and so does a held daemon
    (``Communicator.hold_daemon``): the garbage collector can free anywhere,
    including on the poller, which must always get back to its watchdog. Numba's hold is
    a plain counter shared by all threads, hence the lock."""
    hold = cuda.defer_cleanup()
    with _frees_lock:
        hold.__enter__()
    try:
        yield
    finally:
        with _frees_lock:
            hold.__exit__(None, None, None)


def synchronize_device() -> None:
    """A real device-wide synchronize (GPU only; the communicator emulates it otherwise)."""
    cuda.synchronize()


def precise_sleeps() -> None:
    """Make this thread's short sleeps short: Linux adds up to 50 us of timer slack to every
    sleep, which would dominate a collective that takes a few microseconds."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)   # PR_SET_TIMERSLACK, 1 ns
    except (OSError, AttributeError):
        pass


def _install_gentle_block_supervisor() -> None:
    """The simulator's block supervisor polls its threads in a tight loop holding the GIL;
    a daemon block lives for seconds, so let the supervisor sleep between polls."""
    from numba.cuda.simulator import kernel as simkernel

    if getattr(simkernel.BlockManager, "_pydfccl_gentle", False):
        return
    original_is_alive = simkernel.BlockThread.is_alive

    def is_alive(self):
        time.sleep(50e-6)
        return original_is_alive(self)

    simkernel.BlockThread.is_alive = is_alive
    simkernel.BlockManager._pydfccl_gentle = True
    sys.setswitchinterval(1e-4)


if SIMULATOR:
    _install_gentle_block_supervisor()
