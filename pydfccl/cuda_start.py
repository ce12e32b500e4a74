"""The CUDA driver started and the GPU's context made in a background thread while the
calling thread imports Numba's CUDA target, rather than one after the other.

The two take about as long as each other: Numba's CUDA target 0.6 to 0.8 s to import on an
H100 host, the driver's start 0.1 s and the context 0.1 s, or 0.5 s with the 32 hardware
work queues a process of rank threads asks for (``cuda_env``). The driver's calls go
through ctypes, which lets go of the GIL for each, so the imports go on beside them. Numba
then finds the device's primary context made and takes it as its own.

Only for a process that will use its GPU (``launch``'s rank threads): a context holds GPU
memory, and a process that only starts rank processes must not make one. Importable
without Numba and without a GPU; nothing here raises: whatever fails, Numba meets again
where it makes the context, and reports.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time

__all__ = ["simulated", "driver_library", "begin", "settle", "background_seconds"]

_lock = threading.Lock()
_thread: threading.Thread | None = None
_held: tuple | None = None        # (driver library, device) whose primary context is retained
_seconds: float | None = None     # how long the background start took


def simulated() -> bool:
    """Whether Numba will run kernels on its simulator (``NUMBA_ENABLE_CUDASIM``, which
    ``import pydfccl`` sets on a machine without a CUDA driver)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0").strip() not in ("", "0")


def driver_library():
    """The CUDA driver's library (ctypes), or None where it is not installed."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def begin(device: int = 0) -> None:
    """Start the driver and retain GPU ``device``'s primary context (the one Numba uses) in
    a background thread, where the driver shows that GPU. Does nothing where Numba's CUDA
    target is loaded already (nothing left to overlap: the program may have chosen another
    GPU through it), under the simulator, or when begun before."""
    global _thread
    with _lock:
        if _thread is not None or "numba.cuda" in sys.modules or simulated():
            return
        _thread = threading.Thread(target=_retain, args=(device,), daemon=True,
                                   name="pydfccl-cuda-start")
        _thread.start()


def _retain(device: int) -> None:
    global _held, _seconds
    began = time.perf_counter()
    lib = driver_library()
    handle, context = ctypes.c_int(0), ctypes.c_void_p()
    if (lib is not None and lib.cuInit(0) == 0
            and lib.cuDeviceGet(ctypes.byref(handle), device) == 0
            and lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle) == 0):
        _held = (lib, handle)
    _seconds = time.perf_counter() - began


def settle() -> None:
    """Wait for ``begin``'s thread, then give back its hold on the context: called once
    Numba holds the context itself, so that the context ends when Numba lets it go, as it
    would have without ``begin``."""
    global _held
    with _lock:
        thread = _thread
    if thread is None:
        return
    thread.join()
    with _lock:
        held, _held = _held, None
    if held is not None:
        lib, handle = held
        release = getattr(lib, "cuDevicePrimaryCtxRelease_v2", None) or \
            lib.cuDevicePrimaryCtxRelease
        release(handle)


def background_seconds() -> float | None:
    """How long ``begin``'s driver start and context took (None: not begun or not done)."""
    return _seconds
