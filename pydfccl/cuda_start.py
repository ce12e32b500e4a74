"""Start the CUDA driver, and the only GPU's primary context, early on a thread of their own.

A warm start spends about half a second importing Numba's CUDA target (Python, holding the
GIL) and about as long making the CUDA context (the driver, in C). ``start()`` makes the
context through ctypes, which releases the GIL, while that import goes on: when Numba
retains the GPU's primary context it finds it made. The runtime's packages call it first
thing (``pydfccl.platform``, ``pydfccl.kernels``), so ``import pydfccl`` alone starts
nothing, and neither does the simulator.

It does nothing where it could do harm: without a CUDA driver, under the simulator, with
``PYDFCCL_EARLY_CONTEXT=0``, where several GPUs are visible (a rank's GPU is chosen later,
by its local rank: a context on another GPU would hold that GPU's memory for nothing), and
once ``hold()`` was called (``build-kernels`` compiles on the CPU and uses no GPU). The
context it retains is the process's for its life, as Numba's and torch's retains of the
same primary context make it anyway.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading

__all__ = ["start", "hold", "wait", "ENV"]

ENV = "PYDFCCL_EARLY_CONTEXT"
_lock = threading.Lock()
_thread: threading.Thread | None = None
_held = False
outcome: str | None = None      # what the thread did, once it ended (for tests)


def hold() -> None:
    """Never start early in this process (a process that uses no GPU)."""
    global _held
    _held = True


def _wanted() -> bool:
    if _held or os.environ.get(ENV, "1") == "0":
        return False
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0")


def start() -> None:
    """Begin making the context on a daemon thread, once a process, where wanted."""
    global _thread
    with _lock:
        if _thread is not None or not _wanted():
            return
        _thread = threading.Thread(target=_open, name="pydfccl-cuda-start", daemon=True)
        _thread.start()
    atexit.register(wait, 5.0)   # not in the driver while the process tears it down


def wait(timeout: float | None = None) -> str | None:
    """Wait for the thread (if one started); what it did."""
    if _thread is not None:
        _thread.join(timeout)
    return outcome


def _open() -> None:
    global outcome
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        outcome = "no driver"
        return
    count, device, context = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_void_p()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        outcome = "no GPU"
    elif count.value != 1:
        outcome = f"driver only ({count.value} GPUs: the rank's is chosen later)"
    elif (cuda.cuDeviceGet(ctypes.byref(device), 0) != 0
          or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) != 0):
        outcome = "driver only (the context failed: Numba makes it and reports why)"
    else:
        outcome = "context"
