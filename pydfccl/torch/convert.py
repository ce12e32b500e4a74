"""From torch's vocabulary to pydfccl's: reduce ops, dtypes, and tensors as buffers.

Everything that would make a collective wrong is refused here with the problem named:
an unsupported op or dtype, a non-contiguous tensor, a tensor on the wrong device.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .. import platform
from ..protocol.codes import OPS

__all__ = ["op_name", "torch_op", "dtype_name", "check_tensor", "as_buffer"]

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MAX: "max",
        dist.ReduceOp.MIN: "min", dist.ReduceOp.AVG: "avg"}

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
           torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
           torch.int8: "int8", torch.uint8: "uint8"}

_TYPESTR = {"float16": "<f2", "bfloat16": "<u2", "float32": "<f4", "float64": "<f8",
            "int32": "<i4", "int64": "<i8", "int8": "|i1", "uint8": "|u1"}


def op_name(op) -> str:
    """pydfccl's name of a ``torch.distributed.ReduceOp`` (or of a name already)."""
    if isinstance(op, str) and op in OPS:
        return op
    for torch_op, name in _OPS.items():
        try:
            if op == torch_op:
                return name
        except TypeError:
            break
    raise ValueError(f"pydfccl.torch: reduce op {op!r} is not supported; supported: "
                     "SUM, PRODUCT, MAX, MIN, AVG")


def torch_op(name: str):
    """The ``torch.distributed.ReduceOp`` of pydfccl's op ``name`` (``op_name`` reversed)."""
    for torch_op_, op in _OPS.items():
        if op == name:
            return torch_op_
    raise ValueError(f"pydfccl.torch: no torch reduce op for {name!r}")


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPES:
        raise TypeError(f"pydfccl.torch: dtype {dtype} is not supported; supported: "
                        f"{', '.join(str(d) for d in _DTYPES)}")
    return _DTYPES[dtype]


def check_tensor(t, what: str, device=None) -> None:
    """A tensor pydfccl can take as ``what`` (e.g. "all_reduce's tensor")."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"pydfccl.torch: {what} must be a torch.Tensor, got {type(t).__name__}")
    dtype_name(t.dtype)
    if not t.is_contiguous():
        raise ValueError(f"pydfccl.torch: {what} is not contiguous; pass t.contiguous()")
    if t.is_cuda and platform.backend.kernels_on_host:
        raise ValueError(f"pydfccl.torch: {what} is on {t.device}, but pydfccl runs on the "
                         "CUDA simulator here: use CPU tensors")
    if not t.is_cuda and platform.gpu_available():
        raise ValueError(f"pydfccl.torch: {what} is on {t.device}, but pydfccl runs on the "
                         "GPU: use CUDA tensors")
    if device is not None and t.device != device:
        raise ValueError(f"pydfccl.torch: {what} is on {t.device}, the other tensor on {device}")


class _CudaBuffer:
    """A CUDA tensor's memory as pydfccl's buffer checks read it (``__cuda_array_interface__``
    of a flat array), without torch's own interface, which has no bfloat16 and may
    synchronize."""

    def __init__(self, t: torch.Tensor):
        self.tensor = t
        self.__cuda_array_interface__ = dict(
            shape=(t.numel(),), typestr=_TYPESTR[dtype_name(t.dtype)], strides=None,
            data=(t.data_ptr(), False), version=3)


def as_buffer(t: torch.Tensor):
    """What ``Communicator.run`` takes for tensor ``t``: a numpy view of a CPU tensor
    (simulator; bfloat16 as its raw bits), or a flat view of a CUDA tensor's memory."""
    if t.is_cuda:
        return _CudaBuffer(t)
    flat = t.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        flat = flat.view(torch.uint16)
    return flat.numpy()
