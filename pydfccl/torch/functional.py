"""torch.distributed's functional collectives over pydfccl, with the same names and
arguments. ``group`` is a ``TorchGroup``, a process group made with backend "dfccl", or
None for the default one (``set_default_group``, else torch's default process group when
it is a dfccl one). ``src``/``dst`` are ranks of that group."""

from __future__ import annotations

import torch.distributed as dist

from .convert import check_tensor, op_name
from .group import TorchGroup

__all__ = ["set_default_group", "get_group", "all_reduce", "all_gather_into_tensor",
           "reduce_scatter_tensor", "broadcast", "reduce", "send", "recv", "isend", "irecv",
           "all_to_all_single"]

_default: TorchGroup | None = None


def set_default_group(group: TorchGroup | None) -> None:
    global _default
    _default = group


def get_group(group=None) -> TorchGroup:
    """The TorchGroup that ``group`` names."""
    if isinstance(group, TorchGroup):
        return group
    if group is None and _default is not None:
        return _default
    if group is None and dist.is_available() and dist.is_initialized():
        group = dist.distributed_c10d._get_default_group()
    inner = getattr(group, "dfccl_group", None)
    if inner is None:
        raise ValueError(f"pydfccl.torch: {group!r} is not a pydfccl group; pass a TorchGroup "
                         "or a process group made with backend='dfccl'")
    return inner


def _tensors(what, *tensors):
    for t in tensors:
        check_tensor(t, what)


def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _tensors("all_reduce's tensor", tensor)
    g = get_group(group)
    return g.run("all_reduce", tensor, None, count=tensor.numel(), op=op_name(op),
                 async_op=async_op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    _tensors("all_gather_into_tensor's tensors", output_tensor, input_tensor)
    g = get_group(group)
    if output_tensor.numel() != g.size * input_tensor.numel():
        raise ValueError(f"pydfccl.torch: all_gather_into_tensor: output has "
                         f"{output_tensor.numel()} elements, needs {g.size} x "
                         f"{input_tensor.numel()} (group size x input)")
    return g.run("all_gather", input_tensor, output_tensor, count=input_tensor.numel(),
                 async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _tensors("reduce_scatter_tensor's tensors", output, input)
    g = get_group(group)
    if input.numel() != g.size * output.numel():
        raise ValueError(f"pydfccl.torch: reduce_scatter_tensor: input has {input.numel()} "
                         f"elements, needs {g.size} x {output.numel()} (group size x output)")
    return g.run("reduce_scatter", input, output, count=output.numel(), op=op_name(op),
                 async_op=async_op)


def broadcast(tensor, src, group=None, async_op=False):
    _tensors("broadcast's tensor", tensor)
    g = get_group(group)
    return g.run("broadcast", tensor, None, count=tensor.numel(),
                 root=g.check_rank(src, "broadcast src"), async_op=async_op)


def reduce(tensor, dst, op=dist.ReduceOp.SUM, group=None, async_op=False):
    _tensors("reduce's tensor", tensor)
    g = get_group(group)
    return g.run("reduce", tensor, None, count=tensor.numel(), op=op_name(op),
                 root=g.check_rank(dst, "reduce dst"), async_op=async_op)


def isend(tensor, dst, group=None):
    _tensors("send's tensor", tensor)
    g = get_group(group)
    return g.run("send", tensor, None, count=tensor.numel(),
                 peer=g.check_rank(dst, "send dst", not_self=True), async_op=True)


def irecv(tensor, src, group=None):
    _tensors("recv's tensor", tensor)
    g = get_group(group)
    return g.run("recv", tensor, None, count=tensor.numel(),
                 peer=g.check_rank(src, "recv src", not_self=True), async_op=True)


def send(tensor, dst, group=None) -> None:
    isend(tensor, dst, group).wait()


def recv(tensor, src, group=None) -> int:
    irecv(tensor, src, group).wait()
    return src


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    _tensors("all_to_all_single's tensors", output, input)
    g = get_group(group)
    for name, splits in (("output_split_sizes", output_split_sizes),
                         ("input_split_sizes", input_split_sizes)):
        if splits and len(set(splits)) > 1:
            raise ValueError(f"pydfccl.torch: all_to_all_single: uneven {name} {list(splits)} "
                             "are not supported (pydfccl's all_to_all has one count)")
    if input.numel() % g.size or output.numel() != input.numel():
        raise ValueError(f"pydfccl.torch: all_to_all_single: input has {input.numel()} and "
                         f"output {output.numel()} elements; both must be the same multiple "
                         f"of the group size {g.size}")
    return g.run("all_to_all", input, output, count=input.numel() // g.size,
                 async_op=async_op)
