"""torch.distributed's functional collectives over pydfccl, with the same names and
arguments. ``group`` is a ``TorchGroup``, a process group made with backend "dfccl", or
None for the default one (``set_default_group``, else torch's default process group when
it is a dfccl one). ``src``/``dst`` are ranks of that group."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .convert import check_tensor, op_name
from .group import TorchGroup
from .work import completed_work

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
    """Even splits (or none) run one all_to_all; uneven ones (``*_split_sizes``: rows of
    dim 0 to and from each rank, as torch's) one all_to_allv."""
    _tensors("all_to_all_single's tensors", output, input)
    g = get_group(group)
    even = all(len(set(s or [0])) == 1 for s in (output_split_sizes, input_split_sizes))
    if not (even and output.numel() == input.numel() and input.numel() % g.size == 0):
        return _all_to_allv(g, output, input, list(output_split_sizes or []),
                            list(input_split_sizes or []), async_op)
    return g.run("all_to_all", input, output, count=input.numel() // g.size,
                 async_op=async_op)


def _all_to_allv(g, output, input, out_splits, in_splits, async_op):
    """Every rank's input splits are gathered first, so that a split that does not match
    its peer's is named (never a wrong block), and so that every rank prepares the same
    largest count: the next power of two of the largest block, which lets a few
    signatures serve every split."""
    size, rank = g.size, g.rank
    row_in = input[0].numel() if input.dim() and input.shape[0] else 0
    row_out = output[0].numel() if output.dim() and output.shape[0] else 0
    in_splits = in_splits or [input.shape[0] // size] * size
    out_splits = out_splits or [output.shape[0] // size] * size
    for name, splits, t in (("input", in_splits, input), ("output", out_splits, output)):
        if len(splits) != size or sum(splits) != (t.shape[0] if t.dim() else 0):
            raise ValueError(f"pydfccl.torch: all_to_all_single: {name}_split_sizes "
                             f"{splits} must have one entry per rank ({size}) summing to "
                             f"the {name}'s first dimension")
    sends = [s * row_in for s in in_splits]
    matrix = torch.empty(size * size, dtype=torch.int64, device=input.device)
    all_gather_into_tensor(matrix, torch.tensor(sends, dtype=torch.int64, device=input.device),
                           group=g, async_op=True).wait()
    matrix = matrix.view(size, size).tolist()
    expect = [matrix[src][rank] for src in range(size)]
    recvs = [s * row_out for s in out_splits]
    if expect != recvs:
        raise ValueError(f"pydfccl.torch: all_to_all_single: rank {rank} expects {recvs} "
                         f"elements from ranks 0..{size - 1}, but they send {expect}")
    largest = max(max(row) for row in matrix)
    if largest == 0:                    # nothing moves anywhere
        work = completed_work([output], rank, "all_to_all_single")
        return work if async_op else None
    return g.run("all_to_allv", input, output, count=1 << (largest - 1).bit_length(),
                 counts=(sends, recvs), async_op=async_op)
