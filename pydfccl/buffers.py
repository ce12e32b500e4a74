"""Checking user buffers before their addresses go to the daemon.

The daemon trusts the addresses it is given, so everything that could make it read or write
the wrong memory is refused here, with the problem named.
"""

import numpy as np

from . import platform

__all__ = ["buffer_info", "check_buffer", "BufferChecker"]


def buffer_info(array):
    """(address, element count, dtype, contiguous) of a device array (numpy in the simulator)."""
    if platform.SIMULATOR:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"expected a numpy array under the simulator, got {type(array).__name__}")
        return (int(array.ctypes.data), int(array.size), array.dtype,
                bool(array.flags.c_contiguous))
    iface = getattr(array, "__cuda_array_interface__", None)
    if iface is None:
        raise TypeError(f"expected a CUDA device array (with __cuda_array_interface__), got "
                        f"{type(array).__name__}; use comm.empty() or a Numba/CuPy/PyTorch CUDA array")
    shape = tuple(iface["shape"])
    dtype = np.dtype(iface["typestr"])
    count = int(np.prod(shape)) if shape else 1
    strides = iface.get("strides")
    contiguous = strides is None or strides == _c_strides(shape, dtype.itemsize)
    return int(iface["data"][0]), count, dtype, contiguous


def _c_strides(shape, itemsize):
    strides, step = [], itemsize
    for dim in reversed(shape):
        strides.append(step)
        step *= dim
    return tuple(reversed(strides))


def check_buffer(array, spec, role: str, needed: int) -> int:
    """The address of ``array`` if it can serve as ``role`` ("send"/"recv") of ``spec``,
    holding at least ``needed`` elements."""
    addr, count, dtype, contiguous = buffer_info(array)
    where = f"collective {spec.coll_id} ({spec.kind}): {role} buffer"
    if dtype != np.dtype(spec.dtype):
        raise TypeError(f"{where} has dtype {dtype}, expected {spec.dtype}")
    if count < needed:
        raise ValueError(f"{where} has {count} elements, needs at least {needed}")
    if not contiguous:
        raise ValueError(f"{where} is not C-contiguous")
    if addr == 0:
        raise ValueError(f"{where} has a null address")
    return addr


class BufferChecker:
    """``check_buffer`` that remembers the layouts it accepted for each collective and role.

    Checking a device array from scratch costs several microseconds of Python (dtype and
    stride arithmetic), as much as the collective itself; a layout already accepted (same
    typestr, shape and strides) only needs its address read.
    """

    def __init__(self):
        self._accepted: set = set()

    def __call__(self, array, spec, role: str, needed: int) -> int:
        iface = None if platform.SIMULATOR else getattr(array, "__cuda_array_interface__", None)
        if iface is None:
            return check_buffer(array, spec, role, needed)
        key = (spec.coll_id, role, iface["typestr"], iface["shape"], iface.get("strides"))
        addr = iface["data"][0]
        if key in self._accepted and addr:
            return addr
        addr = check_buffer(array, spec, role, needed)
        self._accepted.add(key)
        return addr
