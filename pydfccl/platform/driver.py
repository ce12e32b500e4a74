"""CUDA driver calls of the GPU backend (through cuda-python): the process's device, device
attributes, host memory registered for the device, and memory shared between rank processes
(CUDA IPC). Importable without a GPU; only a call needs one."""

from __future__ import annotations

import ctypes
import weakref

from numba import cuda

from .. import gpu_query

__all__ = ["driver_result", "use_device", "device_attribute", "mps_active", "register_host",
           "unregister_host", "IPC_HANDLE_BYTES", "ipc_handle", "PeerBuffer"]


def driver_result(result, what: str):
    """cuda-python calls return (error, values...): raise on an error, else the values."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


def use_device(index: int) -> int:
    """Make GPU ``index`` (modulo the GPUs present) this process's device; returns it. Rank
    processes of one host spread over its GPUs by their local rank."""
    device = index % len(cuda.gpus)
    gpu_query.choose_device(device)
    cuda.select_device(device)
    return device


def device_attribute(name: str) -> int:
    """The driver's ``CU_DEVICE_ATTRIBUTE_<name>`` of the current thread's GPU."""
    from cuda.bindings import driver

    cuda.current_context()
    device = driver_result(driver.cuCtxGetDevice(), "cuCtxGetDevice")
    return int(driver_result(driver.cuDeviceGetAttribute(
        getattr(driver.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}"), device),
        f"cuDeviceGetAttribute({name})"))


def mps_active() -> bool:
    """Whether this process's context is shared through the MPS daemon: without it, kernels
    of rank processes that share one GPU take turns in time slices of milliseconds."""
    return bool(device_attribute("MPS_ENABLED"))


def register_host(view) -> int:
    """Page-lock the numpy ``view`` and map it for the device; returns its device address."""
    from cuda.bindings import driver

    cuda.current_context()
    ptr = int(view.ctypes.data)
    driver_result(driver.cuMemHostRegister(ptr, view.nbytes, driver.CU_MEMHOSTREGISTER_PORTABLE
                                    | driver.CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
    return int(driver_result(driver.cuMemHostGetDevicePointer(ptr, 0), "cuMemHostGetDevicePointer"))


def unregister_host(ptr: int) -> None:
    from cuda.bindings import driver

    driver.cuMemHostUnregister(ptr)


IPC_HANDLE_BYTES = 64


def ipc_handle(buffer) -> bytes:
    """The CUDA IPC handle of a ``DeviceBuffer``'s allocation, as bytes another process can
    open."""
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
