"""The simulator backend (``NUMBA_ENABLE_CUDASIM=1``): "device" memory is ordinary host
memory (optionally shared between rank processes), and a kernel launch runs to completion
on the calling thread."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from .base import Backend
from .storage import HostStorage, host_bytes

__all__ = ["SimulatorBackend", "SimulatedBuffer", "install_gentle_block_supervisor"]


class SimulatedBuffer:
    """Zeroed memory of ``nbytes`` standing for device memory or mapped pinned memory: host
    memory, or a view of memory the caller provides and has zeroed (a shared-memory segment
    that other rank processes map too). ``addr`` is the daemon's address, ``array`` the
    host's view, ``write`` and ``read`` copy in and out."""

    def __init__(self, nbytes: int, host_view: np.ndarray | None = None):
        self.nbytes = nbytes
        self.array = host_view if host_view is not None else np.zeros(nbytes, np.uint8)
        self.addr = int(self.array.ctypes.data)

    def write(self, offset: int, data: np.ndarray) -> None:
        raw = host_bytes(data)
        self.array[offset:offset + raw.size] = raw

    def zero_rows(self, regions, write=None) -> None:
        """Zero each ``(offset, pitch, width, rows)`` region (``rows`` runs of ``width``
        bytes, ``pitch`` apart), then ``write`` (``(offset, data)``), if given."""
        for offset, pitch, width, rows in regions:
            if rows <= 0:
                continue
            end = offset + (rows - 1) * pitch + width
            if offset < 0 or pitch < width or end > self.array.size:
                raise IndexError(f"region ({offset}, {pitch}, {width}, {rows}) is not "
                                 f"inside {self.array.size} bytes")
            view = np.lib.stride_tricks.as_strided(self.array[offset:], (rows, width),
                                                   (pitch, 1), writeable=True)
            view[...] = 0
        if write is not None:
            self.write(*write)

    def read(self, offset: int, nbytes: int) -> np.ndarray:
        return self.array[offset:offset + nbytes].copy()


class SimulatorBackend(Backend):
    name = "simulator"
    kernels_on_host = True
    device_memory_is_host = True
    launch_runs_kernel = True
    one_kernel_per_process = True
    watchdog_seconds = 60.0
    # A collective takes milliseconds of CPU, which a spinning waiter would only slow.
    waiter_spin_seconds = 0.0
    DeviceBuffer = SimulatedBuffer
    HostBuffer = SimulatedBuffer
    array_storage = HostStorage()
    # the simulator's device clock
    event_clock_ns = staticmethod(time.perf_counter_ns)

    def __init__(self):
        # One kernel at a time per process (a launch made while another runs is taken for
        # a device-function call): launches from several host threads take turns.
        self._launching = threading.Lock()
        install_gentle_block_supervisor()

    def gpu_available(self) -> bool:
        return False

    def address_of(self, array) -> int:
        """The address the daemon uses for ``array`` (a host pointer)."""
        return int(array.ctypes.data)

    def bind_thread(self) -> None:
        pass

    def host_array(self, array) -> np.ndarray | None:
        """Numba's simulated device arrays too (``cuda.to_device``, ``cuda.device_array``):
        a Numba program runs unchanged on both backends."""
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        if isinstance(array, FakeCUDAArray):
            return array._ary
        return super().host_array(array)

    def stream_handle(self, stream) -> int:
        """Numba's simulated streams too (their kernels ran when they were launched)."""
        from numba.cuda.simulator import api

        if isinstance(stream, api.stream):
            return 0
        return super().stream_handle(stream)

    def stream_write_ops(self) -> None:
        return None

    def multiprocessors(self) -> None:
        return None

    def device_memory_used(self) -> None:
        return None

    def flush_frees(self) -> int:
        return 0

    def clear_layout_cache(self) -> int:
        return 0

    def empty(self, count: int, dtype) -> np.ndarray:
        """A user buffer: a numpy array."""
        return np.empty(count, dtype)

    def new_stream(self) -> None:
        return None

    def destroy_stream(self, stream) -> None:
        pass

    def configure_launch(self, kernel, nblocks: int, nthreads: int, stream):
        return kernel[nblocks, nthreads]

    def launch(self, configured, args) -> None:
        """Run a ``configure_launch`` kernel; returns when it has exited."""
        with self._launching:
            configured(*args)

    def launch_ahead(self, configured, args) -> bool:
        """False, nothing launched: a launch would run on the calling thread."""
        return False

    def synchronize_device(self) -> None:
        """Nothing to wait for: a launch has ended when its call returns."""


_PYTHON_SWITCH_INTERVAL = 0.005     # Python's default GIL switch interval (seconds)


def install_gentle_block_supervisor() -> None:
    """The simulator's block supervisor polls its threads in a tight loop holding the GIL;
    a daemon block lives for seconds, so let the supervisor sleep between polls.

    A block of one thread (the daemon's, under the simulator) needs no supervisor to meet
    at a barrier: its ``syncthreads`` returns at once, not after the supervisor's next poll
    (two barriers a daemon step), and the supervisor waits for the thread to end in
    ``join``, which returns as it ends, rather than waking every 50 us. Python's default GIL
    switch interval (5 ms) becomes 0.1 ms, so that rank threads take turns often; one the
    program set itself (``bench --switch-interval``) is kept, whenever the platform loads."""
    from numba.cuda.simulator import kernel as simkernel

    if getattr(simkernel.BlockManager, "_pydfccl_gentle", False):
        return
    original_is_alive = simkernel.BlockThread.is_alive
    original_syncthreads = simkernel.BlockThread.syncthreads

    def alone(thread) -> bool:
        return int(np.prod(thread._manager._block_dim)) == 1

    def is_alive(self):
        if alone(self) and self is not threading.current_thread():
            self.join(0.01)
        else:
            time.sleep(50e-6)
        return original_is_alive(self)

    def syncthreads(self):
        if not alone(self):
            return original_syncthreads(self)
        if self.abort:
            raise RuntimeError("abort flag set on syncthreads call")

    simkernel.BlockThread.is_alive = is_alive
    simkernel.BlockThread.syncthreads = syncthreads
    simkernel.BlockManager._pydfccl_gentle = True
    if sys.getswitchinterval() == _PYTHON_SWITCH_INTERVAL:     # a program's own choice stays
        sys.setswitchinterval(1e-4)
