"""Host-side portability: the few host operations that differ between a GPU and the CUDA
simulator (allocation, addresses, streams, launching, synchronizing).

``backend`` is chosen once, at import: ``simulator.SimulatorBackend`` under
``NUMBA_ENABLE_CUDASIM=1`` (device memory is host memory, a launch runs the kernel on the
calling thread), else ``gpu.GpuBackend`` (launches are queued on non-blocking streams).
Library code asks it what differs by name (``backend.launch_runs_kernel``,
``backend.waiter_spin_seconds``, ...) and never which backend it is; the module-level names
below are its operations, for callers that need one of them.
"""

from __future__ import annotations

from numba import cuda

from ..kernels.memory import SIMULATOR
from .base import Backend, deferred_frees, precise_sleeps
from .driver import (PeerBuffer, device_attribute, driver_result, ipc_handle, mps_active,
                     use_device)

# A daemon deliberately uses a few blocks; Numba's low-occupancy warning would fire on every
# launch.
cuda.config.CUDA_LOW_OCCUPANCY_WARNINGS = 0

if SIMULATOR:
    from .simulator import SimulatorBackend as _Chosen
else:
    from .gpu import GpuBackend as _Chosen

backend: Backend = _Chosen()

__all__ = ["backend", "Backend", "SIMULATOR", "WAIT_SPIN_SECONDS", "LAUNCHES_ARE_QUEUED",
           "event_clock_ns", "gpu_available", "DeviceBuffer", "HostBuffer", "PeerBuffer",
           "ipc_handle", "use_device", "bind_thread", "mps_active", "device_attribute",
           "device_memory_used", "flush_frees", "multiprocessors", "driver_result",
           "address_of", "empty", "new_stream", "destroy_stream", "configure_launch",
           "launch", "launch_ahead", "wait_stream", "synchronize_device", "deferred_frees",
           "to_numpy", "copy_in", "precise_sleeps", "NUMBA_DEVICE_ARRAY",
           "clear_layout_cache", "stream_handle", "stream_write_ops"]

# For tests and scripts; library code reads ``backend``'s attributes instead.
WAIT_SPIN_SECONDS = backend.waiter_spin_seconds
LAUNCHES_ARE_QUEUED = not backend.launch_runs_kernel
NUMBA_DEVICE_ARRAY = backend.numba_device_array

DeviceBuffer = backend.DeviceBuffer
HostBuffer = backend.HostBuffer
event_clock_ns = backend.event_clock_ns
gpu_available = backend.gpu_available
address_of = backend.address_of
bind_thread = backend.bind_thread
multiprocessors = backend.multiprocessors
device_memory_used = backend.device_memory_used
flush_frees = backend.flush_frees
clear_layout_cache = backend.clear_layout_cache
empty = backend.empty
to_numpy = backend.to_numpy
copy_in = backend.copy_in
new_stream = backend.new_stream
destroy_stream = backend.destroy_stream
configure_launch = backend.configure_launch
# Callers look ``launch`` up here at each call, so a test may put a stand-in in its place.
launch = backend.launch
launch_ahead = backend.launch_ahead
wait_stream = backend.wait_stream
stream_handle = backend.stream_handle
stream_write_ops = backend.stream_write_ops
synchronize_device = backend.synchronize_device
