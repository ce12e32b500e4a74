"""The "dfccl" torch.distributed backend: ``init_process_group(backend="dfccl")`` and
``new_group(..., backend="dfccl")``.

torch hands the backend's creator a c10d Store; ``C10dStoreGroup`` (``bootstrap/c10d.py``:
JSON over the store, never pickle) makes it the process group that pydfccl's bootstrap
needs, so each torch process group gets its own pydfccl world and
daemon. Without a GPU the ranks run the CUDA simulator; on GPUs this needs CUDA IPC
between the rank processes (``communicator_from_group``).
"""

from __future__ import annotations

import os
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from ..bootstrap.c10d import C10dStoreGroup
from ..sched.choice import policy_from_env
from .group import TorchGroup, _simulated

__all__ = ["C10dStoreGroup", "ProcessGroupDfccl", "register", "status_report", "stats",
           "BACKEND_NAME"]

BACKEND_NAME = "dfccl"
_live = weakref.WeakSet()     # this process's dfccl process groups, for status_report()


# A torch job makes several process groups (the default one, tensor- and data-parallel
# ones, ...), each a communicator with a daemon of its own on the rank's GPU. Each daemon
# takes a quarter of the rank's share of the GPU's resident blocks, so that the daemons of
# four groups on every rank fit at once beside torch's own kernels.
DAEMONS_PER_RANK = 4


def comm_options() -> dict:
    """Options of a torch group's communicator: the policy of ``PYDFCCL_POLICY`` and
    ``PYDFCCL_PARAMS`` (``dfccl`` by default), room for 64 signatures (and transfer
    places; each costs a connector set), under the simulator 4 KiB slots (fewer simulated
    steps per collective), and daemons sized for DAEMONS_PER_RANK groups a rank.
    ``PYDFCCL_TORCH_MAX_COLLS``, ``PYDFCCL_TORCH_SLOT_BYTES`` and ``PYDFCCL_TORCH_NBLOCKS``
    (a rank's daemon blocks) change them."""
    from ..platform import backend

    options = dict(max_colls=int(os.environ.get("PYDFCCL_TORCH_MAX_COLLS", "64")),
                   daemons_per_rank=DAEMONS_PER_RANK, policy=policy_from_env())
    slot = os.environ.get("PYDFCCL_TORCH_SLOT_BYTES", "4096" if backend.kernels_on_host else "")
    if slot:
        options["slot_bytes"] = int(slot)
    nblocks = os.environ.get("PYDFCCL_TORCH_NBLOCKS", "")
    if nblocks:
        options["nblocks"] = int(nblocks)
    return options


class ProcessGroupDfccl(dist.ProcessGroup):
    """A torch process group whose collectives run on a pydfccl communicator.

    Supported: allreduce, all_gather_single (all_gather_into_tensor), allgather (a list of
    equal outputs), reduce_scatter_single (reduce_scatter_tensor), broadcast, reduce,
    send, recv, all_to_all_single (even splits), barrier; one tensor per call."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None = None,
                 **options):
        super().__init__(rank, size)
        from ..bootstrap.mpi import communicator_from_group

        options = {**comm_options(), **options}
        comm = communicator_from_group(C10dStoreGroup(store, rank, size, timeout),
                                       **options)
        comm.start()
        self.dfccl_group = TorchGroup(comm)
        self._rank, self._size = rank, size
        _live.add(self)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def comm(self):
        return self.dfccl_group.comm

    @staticmethod
    def _one(tensors, what):
        if len(tensors) != 1:
            raise ValueError(f"pydfccl.torch: {what} takes one tensor per call, got "
                             f"{len(tensors)}")
        return tensors[0]

    def allreduce(self, tensors, opts=None):
        from .functional import all_reduce
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return all_reduce(self._one(tensors, "allreduce"), op, group=self.dfccl_group,
                          async_op=True)

    def all_gather_single(self, output, input, opts=None):
        from .functional import all_gather_into_tensor
        return all_gather_into_tensor(output, input, group=self.dfccl_group, async_op=True)

    _allgather_base = all_gather_single

    def allgather(self, output_lists, inputs, opts=None):
        """The list form: gathered into one flat tensor, then copied out (after the wait:
        the copies are on the current stream)."""
        outputs, t = self._one(output_lists, "allgather"), self._one(inputs, "allgather")
        flat = torch.empty(self._size * t.numel(), dtype=t.dtype, device=t.device)
        work = self.all_gather_single(flat, t.contiguous())
        work.wait()
        for out, part in zip(outputs, flat.split(t.numel())):
            out.copy_(part.view_as(out))
        return work

    def reduce_scatter_single(self, output, input, opts=None):
        from .functional import reduce_scatter_tensor
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return reduce_scatter_tensor(output, input, op=op, group=self.dfccl_group,
                                     async_op=True)

    _reduce_scatter_base = reduce_scatter_single

    def broadcast(self, tensors, opts=None):
        from .functional import broadcast
        root = opts.rootRank if opts is not None else 0
        return broadcast(self._one(tensors, "broadcast"), root, group=self.dfccl_group,
                         async_op=True)

    def reduce(self, tensors, opts=None):
        from .functional import reduce
        return reduce(self._one(tensors, "reduce"), opts.rootRank, op=opts.reduceOp,
                      group=self.dfccl_group, async_op=True)

    def send(self, tensors, dst, tag=0):
        from .functional import isend
        return isend(self._one(tensors, "send"), dst, group=self.dfccl_group)

    def recv(self, tensors, src, tag=0):
        from .functional import irecv
        return irecv(self._one(tensors, "recv"), src, group=self.dfccl_group)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=None):
        from .functional import all_to_all_single
        return all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                 group=self.dfccl_group, async_op=True)

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        device = "cpu" if not torch.cuda.is_available() or _simulated() else "cuda"
        return self.allreduce([torch.zeros(1, device=device)])

    def shutdown(self) -> None:
        self.dfccl_group.close()

    def __repr__(self):
        return f"ProcessGroupDfccl(rank={self._rank}, size={self._size})"


def status_report() -> str:
    """What every dfccl process group of this process is doing, one line per rank of each
    (``Communicator.status()`` made readable): for a job that seems stuck, the collective
    each rank's daemon is on and whom it waits for."""
    from ..host.watchdog import format_status

    parts = []
    for pg in sorted(_live, key=id):
        comm = pg.comm
        parts.append(f"dfccl group of {comm.nranks} ranks (this process is its rank "
                     f"{comm.rank}):\n" + format_status(comm.status()))
    return "\n".join(parts) or "no dfccl process group in this process"


def stats() -> list[dict]:
    """``Communicator.stats()`` of every dfccl process group of this process (its rank in
    each): collectives completed, preemptions, relaunches of its daemon, ..."""
    return [pg.comm.stats() for pg in sorted(_live, key=id)]


def _create(store, rank, size, timeout):
    return ProcessGroupDfccl(store, rank, size, timeout)


def register() -> None:
    """Make backend "dfccl" known to torch.distributed (importing pydfccl.torch does it)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
