"""The memory behind a ``pydfccl`` array (``pydfccl.host.arrays.Array``) on each backend.

An array is the same object for the user on a GPU and under the simulator; only where its
elements live differs, and that difference is here: ``HostStorage`` keeps them in a numpy
array (the simulator's device memory is host memory), ``NumbaStorage`` in a Numba device
array, read and written through copies the caller supplies (on a GPU, pydfccl's own copy
stream, waited for: ``streams``). Both take "raw" arrays (numpy or Numba, which slice
alike) and host numpy arrays of the raw array's dtype and shape.
"""

from __future__ import annotations

import numpy as np

from ..protocol.codes import normalize_dtype, storage_dtype

__all__ = ["HostStorage", "NumbaStorage", "host_bytes"]


class HostStorage:
    """Elements in a numpy array (the simulator)."""

    name = "host memory"

    def storage_dtype(self, dtype) -> np.dtype:
        """The dtype of the raw array that holds ``dtype``'s elements."""
        return normalize_dtype(dtype)

    def empty(self, shape, dtype) -> np.ndarray:
        return np.empty(shape, self.storage_dtype(dtype))

    def contiguous(self, raw) -> bool:
        return bool(raw.flags.c_contiguous)

    def read(self, raw) -> np.ndarray:
        """A host copy of ``raw``."""
        return raw.copy()

    def write(self, raw, values: np.ndarray) -> None:
        """``values`` (raw's dtype and shape) into ``raw``."""
        raw[...] = values

    def fill(self, raw, value: np.ndarray) -> None:
        """Every element of ``raw`` set to the 0-d ``value`` (raw's dtype)."""
        raw[...] = value

    def interface(self, raw) -> dict | None:
        """The ``__cuda_array_interface__`` of ``raw``; None: host memory has none."""
        return None

    # The raw numpy array's ``__dlpack__`` shares host memory with other libraries.
    dlpack = True


def host_bytes(values) -> np.ndarray:
    """The bytes of host ``values`` as a flat uint8 array, what every copy to a device
    takes (a copy of them only where ``values`` is not C-contiguous)."""
    return np.ascontiguousarray(values).view(np.uint8).reshape(-1)


class NumbaStorage:
    """Elements in a Numba device array (a GPU). ``device_array(shape, dtype)`` allocates;
    ``address(raw)`` is a raw array's device address; ``to_device(addr, host_bytes)`` and
    ``to_host(addr, nbytes) -> host_bytes`` copy flat uint8 arrays to and from an address and
    return once the copy has landed; ``memset(addr, nbytes, pattern, itemsize)`` sets every
    ``itemsize``-byte word to ``pattern`` (itemsize 1, 2 or 4; None: fills go through
    ``to_device``). Copies go by address, not through Numba's views, which cost tens of
    microseconds of Python each."""

    def __init__(self, device_array, address, to_device, to_host, memset=None):
        self._device_array = device_array
        self._address = address
        self._to_device = to_device
        self._to_host = to_host
        self._memset = memset

    name = "a GPU"

    def storage_dtype(self, dtype) -> np.dtype:
        """Numba cannot allocate bfloat16: its elements are kept as uint16 raw bits."""
        return storage_dtype(dtype)

    def empty(self, shape, dtype):
        return self._device_array(shape, self.storage_dtype(dtype))

    def contiguous(self, raw) -> bool:
        return bool(raw.is_c_contiguous())

    def _span(self, raw) -> tuple[int, int]:
        """(device address, bytes) of the C-contiguous ``raw``."""
        if not raw.is_c_contiguous():
            raise ValueError("pydfccl copies need a C-contiguous device array")
        return int(self._address(raw)), raw.size * raw.dtype.itemsize

    def read(self, raw) -> np.ndarray:
        if raw.size == 0:
            return np.empty(raw.shape, raw.dtype)
        return self._to_host(*self._span(raw)).view(raw.dtype).reshape(raw.shape)

    def write(self, raw, values: np.ndarray) -> None:
        if raw.size:
            addr, nbytes = self._span(raw)
            data = host_bytes(values)
            if data.size != nbytes:
                raise ValueError(f"a copy of {data.size} bytes into {nbytes} bytes")
            self._to_device(addr, data)

    def fill(self, raw, value: np.ndarray) -> None:
        if raw.size == 0:
            return
        itemsize = raw.dtype.itemsize
        if self._memset is not None and itemsize in (1, 2, 4):
            pattern = int(np.asarray(value, raw.dtype).reshape(1).view(f"u{itemsize}")[0])
            self._memset(*self._span(raw), pattern, itemsize)
        else:    # 8-byte elements: no single memset writes them
            self.write(raw, np.full(raw.shape, value, raw.dtype))

    def interface(self, raw) -> dict:
        return raw.__cuda_array_interface__

    # Numba's device arrays do not export DLPack; ``__cuda_array_interface__`` shares them.
    dlpack = False
