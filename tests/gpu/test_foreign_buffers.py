"""Buffers made by CuPy and PyTorch (``__cuda_array_interface__``) on the GPU: collectives
read and write them in place, for the dtypes each library exports, and bfloat16 tensors as
their raw bits (``t.view(torch.uint16)``). GPU only: the simulator takes numpy arrays."""

import numpy as np
import pytest

import pydfccl
from pydfccl import platform
from pydfccl.protocol.codes import BFLOAT16

pytestmark = pytest.mark.skipif(not platform.gpu_available(), reason="needs a GPU")

DTYPES = ["float32", "float16", "float64", "int64", "int32", "int8", "uint8"]
COUNT = 1001   # neither a multiple of a slot nor of a 16-byte vector


def _values(rank, dtype):
    return ((np.arange(COUNT) * (rank + 3)) % 7 - 3).astype(dtype)


def _all_reduce_with(make, synchronize):
    """A worker: one all-reduce per dtype on arrays from ``make(values)``, results as numpy."""
    def worker(comm):
        for i, dtype in enumerate(DTYPES):
            comm.prepare(i, "all_reduce", count=COUNT, dtype=dtype, op="sum")
        comm.prepare(len(DTYPES), "all_gather", count=COUNT, dtype="bfloat16")
        comm.start()
        arrays = [make(_values(comm.rank, d)) for d in DTYPES]
        bf16 = make(_values(comm.rank, "float32").astype(BFLOAT16).view(np.uint16))
        gathered = make(np.zeros(COUNT * comm.nranks, np.uint16))
        synchronize()       # the library's fill is on its own stream: finish it first
        futures = [comm.run(i, a) for i, a in enumerate(arrays)]
        futures.append(comm.run(len(DTYPES), bf16, gathered))
        for f in futures:
            f.result(timeout=60)
        return [platform.to_numpy(a) for a in arrays] + [platform.to_numpy(gathered)]
    return worker


def _check(per_rank, nranks):
    for out in per_rank:
        for dtype, got in zip(DTYPES, out):
            want = sum(_values(r, dtype) for r in range(nranks)).astype(dtype)
            assert got.dtype == np.dtype(dtype) and np.array_equal(got, want), dtype
        want = np.concatenate([_values(r, "float32").astype(BFLOAT16).view(np.uint16)
                               for r in range(nranks)])
        assert np.array_equal(out[-1], want)


@pytest.mark.parametrize("nranks", [2, 4])
def test_cupy_arrays(nranks):
    cp = pytest.importorskip("cupy")
    worker = _all_reduce_with(cp.asarray, cp.cuda.Device().synchronize)
    _check(pydfccl.launch(worker, nranks, timeout=300), nranks)


@pytest.mark.parametrize("nranks", [2, 4])
def test_torch_tensors(nranks):
    torch = pytest.importorskip("torch")

    def make(values):
        if values.dtype == np.uint16:     # bfloat16 bits: a bfloat16 tensor viewed as uint16
            return torch.from_numpy(values.view(np.int16)).cuda().view(torch.bfloat16) \
                .view(torch.uint16)
        return torch.from_numpy(values).cuda()

    worker = _all_reduce_with(make, torch.cuda.synchronize)
    _check(pydfccl.launch(worker, nranks, timeout=300), nranks)
