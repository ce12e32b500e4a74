"""The collectives torch.distributed calls on a process group, composed from pydfccl's
preemptible ones (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
all_to_allv, send, recv) without new device code: gather is an all_gather whose root keeps
the result, scatter a broadcast of the root's list, the list forms of all_to_all and
reduce_scatter run on one flat tensor (an all_to_allv where sizes differ), coalesced calls
one collective per tensor (or one flat all-reduce). Tensors with no elements are no-ops, as
in NCCL and gloo. What dfccl cannot do raises ``NotImplementedError`` saying so.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import functional as F
from .work import completed_work

__all__ = ["CollectivesMixin", "lacks"]


def lacks(what: str, instead: str = "") -> NotImplementedError:
    return NotImplementedError(f"the dfccl backend lacks {what}" + (f"; {instead}" if instead
                                                                     else ""))


def _op(opts):
    return opts.reduceOp if opts is not None else dist.ReduceOp.SUM


def _root(opts):
    return opts.rootRank if opts is not None else 0


def _one(tensors, what):
    if len(tensors) != 1:
        raise lacks(f"{what} of {len(tensors)} tensors per call", "pass one tensor")
    return tensors[0]


class CollectivesMixin:
    """torch's ProcessGroup collectives over ``self.dfccl_group`` (a TorchGroup)."""

    def _done(self, outputs, what):
        return completed_work(outputs, self.dfccl_group.rank, what)

    # -- one pydfccl collective each --------------------------------------------------------
    def _allreduce(self, tensors, opts=None):
        return F.all_reduce(_one(tensors, "allreduce"), _op(opts), group=self.dfccl_group,
                            async_op=True)

    def _all_gather_single(self, output, input, opts=None):
        return F.all_gather_into_tensor(output, input, group=self.dfccl_group, async_op=True)

    def _reduce_scatter_single(self, output, input, opts=None):
        return F.reduce_scatter_tensor(output, input, op=_op(opts), group=self.dfccl_group,
                                       async_op=True)

    def _broadcast(self, tensors, opts=None):
        return F.broadcast(_one(tensors, "broadcast"), _root(opts), group=self.dfccl_group,
                           async_op=True)

    def _reduce(self, tensors, opts=None):
        return F.reduce(_one(tensors, "reduce"), _root(opts), op=_op(opts),
                        group=self.dfccl_group, async_op=True)

    def _send(self, tensors, dst, tag=0):
        return F.isend(_one(tensors, "send"), dst, group=self.dfccl_group)

    def _recv(self, tensors, src, tag=0):
        return F.irecv(_one(tensors, "recv"), src, group=self.dfccl_group)

    def _recv_anysource(self, tensors, tag=0):
        raise lacks("recv from any source", "name the sender (src=)")

    def _barrier(self, opts=None):
        return self._allreduce([torch.zeros(1, device=self._comm_device())])

    # -- composed ---------------------------------------------------------------------------
    def _allgather(self, output_lists, inputs, opts=None):
        """The list form: gathered into one flat tensor, then copied out."""
        outputs, t = _one(output_lists, "allgather"), _one(inputs, "allgather").contiguous()
        self._check_list(outputs, t, "allgather's output list")
        flat = t.new_empty(self.size() * t.numel())
        self._all_gather_single(flat, t).wait()
        for out, part in zip(outputs, flat.split(t.numel())):
            out.copy_(part.view_as(out))
        return self._done(output_lists, "allgather")

    def _gather(self, output_lists, inputs, opts=None):
        """An all_gather; the root keeps what it gathered."""
        t, root = _one(inputs, "gather").contiguous(), _root(opts)
        self.dfccl_group.check_rank(root, "gather dst")
        flat = t.new_empty(self.size() * t.numel())
        self._all_gather_single(flat, t).wait()
        if self.rank() == root:
            outputs = _one(output_lists, "gather")
            self._check_list(outputs, t, "gather's gather_list")
            for out, part in zip(outputs, flat.split(t.numel())):
                out.copy_(part.view_as(out))
        return self._done(output_lists, "gather")

    def _scatter(self, outputs, input_lists, opts=None):
        """A broadcast of the root's list as one flat tensor; each rank keeps its part."""
        out, root = _one(outputs, "scatter"), _root(opts)
        self.dfccl_group.check_rank(root, "scatter src")
        n = out.numel()
        if self.rank() == root:
            parts = _one(input_lists, "scatter")
            self._check_list(parts, out, "scatter's scatter_list")
            flat = torch.cat([p.reshape(-1) for p in parts])
        else:
            flat = out.new_empty(self.size() * n)
        F.broadcast(flat, root, group=self.dfccl_group, async_op=True).wait()
        out.copy_(flat[self.rank() * n:(self.rank() + 1) * n].view_as(out))
        return self._done(outputs, "scatter")

    def _reduce_scatter(self, outputs, input_lists, opts=None):
        """The list form: the list concatenated, then reduce_scatter_tensor."""
        out = _one(outputs, "reduce_scatter")
        parts = _one(input_lists, "reduce_scatter")
        self._check_list(parts, out, "reduce_scatter's input list")
        flat = torch.cat([p.reshape(-1) for p in parts])
        result = out.new_empty(out.numel()) if not out.is_contiguous() else out
        self._reduce_scatter_single(result.view(-1), flat, opts).wait()
        if result is not out:
            out.copy_(result.view_as(out))
        return self._done(outputs, "reduce_scatter")

    def _alltoall(self, output_list, input_list, opts=None):
        """The list form: as all_to_all_single on the concatenated lists (uneven sizes
        allowed, counted in elements)."""
        for what, lst in (("output", output_list), ("input", input_list)):
            if len(lst) != self.size():
                raise ValueError(f"pydfccl.torch: alltoall: the {what} list has {len(lst)} "
                                 f"tensors, needs one per rank ({self.size()})")
        inp = torch.cat([t.reshape(-1) for t in input_list])
        out = inp.new_empty(sum(t.numel() for t in output_list))
        self._all_to_all_single(out, inp, [t.numel() for t in output_list],
                                [t.numel() for t in input_list]).wait()
        for t, part in zip(output_list, out.split([t.numel() for t in output_list])):
            t.copy_(part.view_as(t))
        return self._done(output_list, "alltoall")

    def _all_to_all_single(self, output, input, output_split_sizes=None,
                           input_split_sizes=None, opts=None):
        return F.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                   group=self.dfccl_group, async_op=True)

    def _allreduce_coalesced(self, tensors, opts=None):
        """One all-reduce of the tensors concatenated, copied back."""
        if not tensors:
            return self._done([], "allreduce_coalesced")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self._allreduce([flat], opts).wait()
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))
        return self._done(tensors, "allreduce_coalesced")

    def _allgather_coalesced(self, output_lists, inputs, opts=None):
        for outputs, t in zip(output_lists, inputs):
            self._allgather([outputs], [t]).wait()
        return self._done(output_lists, "allgather_coalesced")

    def _allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self._all_gather_single(out, t).wait()
        return self._done(outputs, "allgather_into_tensor_coalesced")

    def _reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self._reduce_scatter_single(out, t, opts).wait()
        return self._done(outputs, "reduce_scatter_tensor_coalesced")

    def _check_list(self, tensors, like, what):
        if len(tensors) != self.size() or any(t.numel() != like.numel() for t in tensors):
            raise ValueError(f"pydfccl.torch: {what} must hold {self.size()} tensors (one per "
                             f"rank) of {like.numel()} elements each, got "
                             f"{[t.numel() for t in tensors]}")

