"""The same user programs as ``tests/ranks/test_arrays.py`` on a GPU (ranks as threads and
as processes), and every kind of GPU buffer in and the very same object out: Numba device
arrays, ``pydfccl.Array``, PyTorch and CuPy arrays, an array that only speaks DLPack; and a
read-only ``__cuda_array_interface__`` refused."""

import numpy as np
import pytest

import pydfccl
from array_workers import array_idioms, futures_hold_buffers, stream_ordered
from pydfccl import platform

pytestmark = pytest.mark.skipif(not platform.gpu_available(), reason="needs a GPU")


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_the_simulators_array_program_runs_unchanged(backend):
    for got in pydfccl.launch(array_idioms, 2, backend=backend, args=(False,), timeout=300):
        assert got["out"] == [0, 3, 6, 1, 1, 1, 1, 1]
        assert got["same"] and got["type"] == "Array"
        assert got["in_place"] == [-7, -7] + [2] * 8 + [-7, -7]
        assert got["in_place_same"] and got["gathered_same"]
        assert got["gathered"] == [0.0, 0.5, 1.0, 0.5]
        assert got["gathered_in_place"] == [0.0, 0.5, 1.0, 0.5]
        assert got["broadcast"] == [1.5] * 4


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_runs_wait_for_the_users_stream_and_the_host_does_not(backend):
    """A producer kernel of about 0.1 s on a Numba stream, then ``run(..., stream=)``: the
    call returns while the stream is still busy, and the sum is of the produced inputs;
    rank 0's run behind a slow stream and its next run without one keep their order."""
    for got in pydfccl.launch(stream_ordered, 2, backend=backend, args=(20_000_000,),
                              timeout=300):
        assert got["summed_ok"] and got["same"] and got["doubled_ok"] and got["again_ok"]
        assert got["busy_after_run"] and got["returned_s"] < 0.05, got
        assert got["ordered"] == [[3.0, 5.0, 7.0, 9.0], [300.0] * 4]
        assert "stream must be a CUDA stream" in got["refused"]


def test_kept_futures_hold_their_buffers_on_the_gpu():
    for got in pydfccl.launch(futures_hold_buffers, 2, args=(False,), backend="threads",
                              timeout=300):
        assert got["results"] == [[1, 1, 1, 1], [3, 3, 3, 3], [5, 5, 5, 5], [2, 2, 2, 2]]
        assert got["dropped"] == 0 and got["warnings"] == []


class DLPackOnly:
    """An array that offers nothing but DLPack (as JAX's do)."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self, **kwargs):
        return self.tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


class ReadOnly:
    def __init__(self, array):
        iface = dict(array.__cuda_array_interface__)
        iface["data"] = (iface["data"][0], True)
        self.__cuda_array_interface__ = iface
        self.array = array


def _every_buffer_type(comm):
    import torch
    from numba import cuda

    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    comm.start()
    value = np.full(4, comm.rank + 1, np.float32)
    made = {"numba": cuda.to_device(value), "torch": torch.from_numpy(value).cuda()}
    made["dlpack"] = DLPackOnly(torch.from_numpy(value).cuda())
    made["pydfccl"] = comm.empty(4, "float32")
    made["pydfccl"][...] = value
    try:
        import cupy
        made["cupy"] = cupy.asarray(value)
    except ImportError:
        pass
    cuda.synchronize()
    out = {}
    for name, buf in made.items():
        result = comm.run(0, buf).result(timeout=60)
        tensor = result.tensor if name == "dlpack" else result
        out[name] = (result is buf, platform.to_numpy(tensor).tolist()
                     if name != "torch" else tensor.cpu().tolist())
    try:
        comm.run(0, ReadOnly(made["numba"]))
    except ValueError as exc:
        out["read-only"] = str(exc)
    return out


def test_every_buffer_type_comes_back_as_itself():
    pytest.importorskip("torch")
    for got in pydfccl.launch(_every_buffer_type, 2, backend="threads", timeout=300):
        names = ["numba", "torch", "dlpack", "pydfccl"] + (["cupy"] if "cupy" in got else [])
        for name in names:
            same, values = got[name]
            assert same, name
            assert values == [3.0] * 4, name
        assert "recv buffer is read-only" in got["read-only"]


def test_copies_of_threads_do_not_wait_for_each_other():
    """Ranks that are threads of one process fill and read their arrays at once: a copy
    made while another thread's copy is under way (holding its pinned buffer and stream)
    completes, and 8 threads writing and reading arrays of their own each get their own."""
    import threading

    from numba import cuda

    from pydfccl.platform import streams

    def address(dev):
        return int(dev.__cuda_array_interface__["data"][0])

    dev = cuda.device_array(1 << 16, np.uint8)
    busy, release, done = threading.Event(), threading.Event(), threading.Event()

    def hold():
        with streams._staging():        # another thread's copy, in progress
            busy.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert busy.wait(60)
        copier = threading.Thread(target=lambda: (streams.host_to_device(
            address(dev), np.full(dev.size, 7, np.uint8)), done.set()))
        copier.start()
        assert done.wait(60), "a copy waited for another thread's"
        assert (streams.device_to_host(address(dev), dev.size) == 7).all()
    finally:
        release.set()
        holder.join()

    arrays = [cuda.device_array(3 << 20, np.uint8) for _ in range(8)]
    seen = [None] * 8

    def round_trip(i):
        for round_ in range(5):
            streams.host_to_device(address(arrays[i]),
                                   np.full(arrays[i].size, i + round_, np.uint8))
            host = streams.device_to_host(address(arrays[i]), arrays[i].size)
            seen[i] = bool((host == i + round_).all()) and (seen[i] is not False)

    threads = [threading.Thread(target=round_trip, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert seen == [True] * 8
