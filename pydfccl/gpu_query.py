"""What a launcher asks the CUDA driver before any rank runs: is there a GPU, and how many
multiprocessors has it (a world's default sizes follow them).

Asked through ctypes, without Numba's CUDA target and without a context: that import takes
most of a second, and once it is loaded ``cuda_start`` can no longer make the context beside
it; a context holds GPU memory, which a process that only starts rank processes must not
take. Also where a rank process keeps the GPU it chose (``platform.driver.use_device``), so
that this module answers for that GPU.
"""

from __future__ import annotations

import ctypes

from .cuda_start import driver_library, simulated

__all__ = ["gpu_count", "multiprocessors", "choose_device", "process_device"]

_MULTIPROCESSOR_COUNT = 16   # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT (cuda.h)
_process_device: int | None = None


def _started_driver():
    """libcuda with the driver started (cuInit), or None where there is none that starts."""
    if simulated():
        return None
    lib = driver_library()
    return lib if lib is not None and lib.cuInit(0) == 0 else None


def gpu_count() -> int:
    """The GPUs this process can use: 0 under the simulator, without a driver, or where the
    driver sees none (``CUDA_VISIBLE_DEVICES=""``, a GPU lost)."""
    lib = _started_driver()
    count = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def multiprocessors(device: int | None = None) -> int | None:
    """The streaming multiprocessors of GPU ``device`` (default: the process's, GPU 0 until
    it chose one), or None where the driver does not answer."""
    lib = _started_driver()
    index = (process_device() or 0) if device is None else device
    handle, value = ctypes.c_int(0), ctypes.c_int(0)
    if (lib is None or lib.cuDeviceGet(ctypes.byref(handle), index) != 0
            or lib.cuDeviceGetAttribute(ctypes.byref(value), _MULTIPROCESSOR_COUNT,
                                        handle) != 0):
        return None
    return value.value


def choose_device(index: int) -> None:
    """Record GPU ``index`` as this process's (``platform.driver.use_device`` selects it)."""
    global _process_device
    _process_device = index


def process_device() -> int | None:
    """The GPU ``choose_device`` recorded, or None if the process chose none."""
    return _process_device
