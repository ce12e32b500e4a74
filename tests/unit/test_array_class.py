"""``pydfccl.Array``: numpy's idioms on both backends. Every test runs against the
simulator's storage (numpy) and against the GPU's (``NumbaStorage``) over the Numba
simulator's device arrays (``FakeCUDAArray``, which slice, reshape and copy as Numba's do),
with copies and memsets made as the GPU's are (bytes at an address), so that the GPU's
logic (views, byte copies, bfloat16 bits, memset patterns) is exercised here too."""

import ctypes

import numpy as np
import pytest
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

import pydfccl
from pydfccl.host.arrays import Array
from pydfccl.platform import backend
from pydfccl.platform.storage import HostStorage, NumbaStorage
from pydfccl.protocol.codes import BFLOAT16


def device_bytes(addr, nbytes):
    """The simulated device memory at ``addr`` (a host address) as a flat uint8 array."""
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(addr))


class Memsets(list):
    """The GPU's memset, done on simulated device memory by address, and recorded."""

    def __call__(self, addr, nbytes, pattern, itemsize):
        self.append((pattern, itemsize))
        device_bytes(addr, nbytes).view(f"u{itemsize}")[:] = pattern


def gpu_like_storage(memsets=None):
    """Copies by address, as the GPU's go: a view's copy lands at its own offset."""
    def to_device(addr, raw):
        device_bytes(addr, raw.size)[:] = raw

    return NumbaStorage(lambda shape, dtype: FakeCUDAArray(np.empty(shape, dtype)),
                        lambda dev: dev.ctypes.data, to_device,
                        lambda addr, nbytes: device_bytes(addr, nbytes).copy(), memsets)


@pytest.fixture(params=["host", "numba"])
def storage(request):
    return HostStorage() if request.param == "host" else gpu_like_storage(Memsets())


def test_fill_assign_slices_and_read_back(storage):
    x = Array.empty(10, "float32", storage)
    x[...] = 3
    x[:4] = np.arange(4)
    x[8:] = [8.5, 9.5]
    assert np.asarray(x).tolist() == [0, 1, 2, 3, 3, 3, 3, 3, 8.5, 9.5]
    assert (x.shape, x.dtype, len(x), x.size, x.nbytes) == ((10,), np.float32, 10, 10, 40)
    assert x[-1] == 9.5 and x[0] == 0


def test_views_share_memory_and_host_values_are_copies(storage):
    x = Array.empty(6, "int64", storage)
    x[...] = 0
    view = x[2:5]
    assert isinstance(view, Array) and view.shape == (3,)
    view[...] = 7
    view[1] = -1
    assert np.asarray(x).tolist() == [0, 0, 7, -1, 7, 0]
    host = np.asarray(x)
    host[:] = 100                       # a copy on every backend
    assert np.asarray(x).tolist() == [0, 0, 7, -1, 7, 0]
    with pytest.raises(ValueError, match="always a copy"):
        np.array(x, copy=False)


def test_two_dimensional_rows_and_broadcasting(storage):
    m = Array.empty((3, 4), "int32", storage)
    m[...] = np.arange(4)               # broadcast along the rows
    m[1] = 9
    m[2, 3] = -5
    assert np.asarray(m).tolist() == [[0, 1, 2, 3], [9, 9, 9, 9], [0, 1, 2, -5]]
    assert m[1].shape == (4,) and m[1:].shape == (2, 4) and m[2, 3] == -5
    assert np.asarray(m.reshape(12))[4:8].tolist() == [9, 9, 9, 9]


@pytest.mark.parametrize("dtype, value", [("int8", -3), ("uint8", 250), ("float16", 1.5),
                                          ("float32", -0.25),
                                          ("int32", 2**31 - 1), ("float64", 1e300),
                                          ("int64", -2**40), ("bfloat16", 1.5)])
def test_scalar_fills_set_every_element_exactly(dtype, value):
    memsets = Memsets()
    for store in (HostStorage(), gpu_like_storage(memsets)):
        x = Array.empty(5, dtype, store)
        x[...] = value
        assert np.asarray(x).dtype == np.dtype(BFLOAT16 if dtype == "bfloat16" else dtype)
        assert np.asarray(x).tolist() == [np.asarray(value, x.dtype).item()] * 5
    itemsize = np.dtype(BFLOAT16 if dtype == "bfloat16" else dtype).itemsize
    # one memset for 1-, 2- and 4-byte elements; 8-byte ones are copied in instead
    assert [size for _, size in memsets] == ([itemsize] if itemsize < 8 else [])


def test_bfloat16_keeps_raw_bits_on_a_gpu_and_values_for_the_user():
    x = Array.empty(3, "bfloat16", gpu_like_storage())
    x[...] = np.array([1.0, -2.5, 3.0], np.float32)
    assert x.dtype == BFLOAT16 and x.raw.dtype == np.uint16
    assert np.asarray(x).tolist() == [1.0, -2.5, 3.0]
    assert np.asarray(x).dtype == BFLOAT16


def test_refused_indices_and_shapes_name_the_problem(storage):
    x = Array.empty(6, "float32", storage)
    with pytest.raises(ValueError, match="contiguous views only"):
        x[::2]
    with pytest.raises(ValueError, match="contiguous ranges only"):
        x[::2] = 1
    with pytest.raises(IndexError, match="out of bounds"):
        x[6]
    with pytest.raises(IndexError, match="too many indices"):
        x[1, 2]
    with pytest.raises(IndexError, match="ints, slices and"):
        x[[1, 2]]
    with pytest.raises(ValueError, match=r"could not broadcast values of shape \(4,\)"):
        x[:3] = np.arange(4)


def test_interfaces_follow_where_the_memory_is():
    host = Array.empty(4, "float32", HostStorage())
    assert not hasattr(host, "__cuda_array_interface__")
    host[...] = 2
    assert np.from_dlpack(host).tolist() == [2.0] * 4          # shares host memory
    gpu = Array.empty(4, "float32", gpu_like_storage())
    assert not hasattr(gpu, "__dlpack__")
    with pytest.raises(AttributeError, match="__cuda_array_interface__ shares it"):
        gpu.__dlpack__


def test_arrays_use_the_backends_storage():
    assert pydfccl.Array is Array
    assert isinstance(backend.array_storage, (HostStorage, NumbaStorage))
    x = Array(np.zeros(3, np.float32), "float32", HostStorage())
    assert "pydfccl.Array(shape=(3,), dtype=float32, on host memory)" == repr(x)
