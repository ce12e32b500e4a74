"""``comm.empty``'s array: one object with numpy's idioms on a GPU and under the simulator.

A program written against the simulator must run unchanged on a GPU, so the array a
communicator makes behaves the same on both: ``x[...] = 3``, ``x[...] = values``,
``x[2:5] = values``, ``np.asarray(x)`` (a host copy), ``x.shape``, ``x.dtype``,
``len(x)``, views ``x[a:b]`` that share its memory, and ``run()`` takes it like any
buffer. Where its elements live (a numpy array, a Numba device array) is the platform's
business (``pydfccl.platform.storage``); on a GPU it also has ``__cuda_array_interface__``,
so CuPy, PyTorch and Numba see it as theirs. Writes and reads wait for their copies: an
array written by ``x[...] = v`` holds ``v`` when ``run()`` is called.
"""

from __future__ import annotations

import numpy as np

from ..platform import backend
from ..protocol.codes import normalize_dtype

__all__ = ["Array"]


class Array:
    """An array in this rank's device memory (host memory under the simulator). Made by
    ``Communicator.empty``; views of it are Arrays too."""

    __slots__ = ("_raw", "_dtype", "_storage", "__weakref__")
    _pydfccl_array = True    # how ``pydfccl.platform`` knows one without importing this

    def __init__(self, raw, dtype, storage=None):
        self._raw = raw                     # numpy or Numba array of the storage dtype
        self._dtype = np.dtype(dtype)       # what the user sees (bfloat16 on a GPU too)
        self._storage = storage if storage is not None else backend.array_storage

    @classmethod
    def empty(cls, shape, dtype, storage=None) -> "Array":
        """An uninitialized array of ``shape`` (an int or a tuple)."""
        storage = storage if storage is not None else backend.array_storage
        dtype = normalize_dtype(dtype)
        return cls(storage.empty(shape, dtype), dtype, storage)

    # -- what it is ----------------------------------------------------------------------

    @property
    def shape(self) -> tuple:
        return tuple(self._raw.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._raw.shape)

    @property
    def size(self) -> int:
        return int(self._raw.size)

    @property
    def nbytes(self) -> int:
        return self.size * self._dtype.itemsize

    def __len__(self) -> int:
        if not self.ndim:
            raise TypeError("len() of a 0-d pydfccl array")
        return self.shape[0]

    def __repr__(self):
        return (f"pydfccl.Array(shape={self.shape}, dtype={self._dtype.name}, "
                f"on {self._storage.name})")

    # -- views -----------------------------------------------------------------------------

    def _raw_view(self, key) -> tuple:
        """(raw view of ``key`` with every int index taken as a length-1 slice, the
        index that drops those axes again from a host copy of it)."""
        if key is Ellipsis or (self.ndim and isinstance(key, slice) and key == slice(None)):
            return self._raw, (slice(None),) * self.ndim   # x[...], x[:]: no view to make
        if not isinstance(key, tuple):
            key = (key,)
        if sum(k is Ellipsis for k in key) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        fixed = [k for k in key if k is not Ellipsis]
        if len(fixed) > self.ndim:
            raise IndexError(f"too many indices for a {self.ndim}-d pydfccl array")
        if Ellipsis in key:
            at = key.index(Ellipsis)
            key = key[:at] + (slice(None),) * (self.ndim - len(fixed)) + key[at + 1:]
        key = key + (slice(None),) * (self.ndim - len(key))
        raw_key, squeeze = [], []
        for axis, k in enumerate(key):
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer, slice)):
                raise IndexError(f"pydfccl arrays take ints, slices and '...' as indices, "
                                 f"not {type(k).__name__}; use np.asarray(x) for the rest")
            if isinstance(k, slice):
                raw_key.append(k)
                squeeze.append(slice(None))
                continue
            n, i = self.shape[axis], int(k)
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
            i %= n
            raw_key.append(slice(i, i + 1))
            squeeze.append(0)
        return self._raw[tuple(raw_key)], tuple(squeeze)

    def __getitem__(self, key):
        """A view (slices, step 1) sharing this array's memory, or a host scalar (ints)."""
        raw, squeeze = self._raw_view(key)
        if all(s == 0 for s in squeeze) and squeeze:
            return self._host(raw)[squeeze]
        if not self._storage.contiguous(raw):
            raise ValueError("pydfccl arrays have contiguous views only (slices of step 1 "
                             "along the first axes); for others, copy: np.asarray(x)[key]")
        if any(s == 0 for s in squeeze):
            raw = raw.reshape(tuple(n for n, s in zip(raw.shape, squeeze) if s != 0))
        return Array(raw, self._dtype, self._storage)

    def reshape(self, *shape) -> "Array":
        """A view of another shape with the same elements."""
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return Array(self._raw.reshape(tuple(shape)), self._dtype, self._storage)

    # -- writing and reading ---------------------------------------------------------------

    def __setitem__(self, key, value) -> None:
        """``value`` (a scalar, a numpy array or anything ``np.asarray`` takes, broadcast
        as numpy would) into the elements ``key`` selects; returns once written."""
        raw, _ = self._raw_view(key)
        if not self._storage.contiguous(raw):
            raise ValueError("pydfccl arrays write contiguous ranges only (slices of step 1 "
                             "along the first axes)")
        values = np.asarray(value if not isinstance(value, Array) else np.asarray(value),
                            dtype=self._dtype)
        raw_dtype = raw.dtype
        if values.ndim == 0:
            self._storage.fill(raw, values.view(raw_dtype))
            return
        try:
            values = np.broadcast_to(values, raw.shape)
        except ValueError:
            raise ValueError(f"could not broadcast values of shape {values.shape} into "
                             f"the {tuple(raw.shape)} elements selected") from None
        self._storage.write(raw, np.ascontiguousarray(values).view(raw_dtype))

    def fill(self, value) -> None:
        """Set every element to ``value``: ``x[...] = value``."""
        self[...] = value

    def _host(self, raw) -> np.ndarray:
        return self._storage.read(raw).view(self._dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        """A host copy of the elements (``np.asarray(x)``): a copy on every backend, so a
        program cannot come to rely on writes through it reaching the array."""
        if copy is False:
            raise ValueError("a pydfccl array's host values are always a copy "
                             "(np.asarray(x) copies; copy=False is not possible)")
        host = self._host(self._raw)
        return host if dtype is None else host.astype(dtype)

    def copy_to_host(self) -> np.ndarray:
        """A host copy of the elements (as Numba's device arrays name it)."""
        return self.__array__()

    def copy_to_device(self, values) -> None:
        """``x[...] = values`` (as Numba's device arrays name it)."""
        self[...] = values

    def tolist(self) -> list:
        return self.__array__().tolist()

    # -- sharing with other libraries ------------------------------------------------------

    @property
    def __cuda_array_interface__(self) -> dict:
        """On a GPU: the array as CuPy, PyTorch and Numba take it. Elements of bfloat16
        show as uint16 (their raw bits)."""
        iface = self._storage.interface(self._raw)
        if iface is None:
            raise AttributeError("a pydfccl array in host memory (the simulator) has no "
                                 "__cuda_array_interface__; np.asarray(x) reads it")
        return iface

    @property
    def __dlpack__(self):
        """Where the memory can be shared through DLPack (host memory, the simulator)."""
        if not self._storage.dlpack:
            raise AttributeError("a pydfccl array on a GPU has no __dlpack__; its "
                                 "__cuda_array_interface__ shares it (torch.as_tensor(x, "
                                 "device='cuda'), cupy.asarray(x))")
        return self._raw.__dlpack__

    @property
    def __dlpack_device__(self):
        if not self._storage.dlpack:
            raise AttributeError("a pydfccl array on a GPU has no __dlpack_device__")
        return self._raw.__dlpack_device__

    # -- for pydfccl -----------------------------------------------------------------------

    @property
    def raw(self):
        """The numpy (simulator) or Numba (GPU) array holding the elements, of the
        storage dtype (uint16 for bfloat16 on a GPU)."""
        return self._raw
