"""pydfccl for PyTorch: torch.distributed's collectives on torch tensors, a "dfccl"
process-group backend, and a DDP communication hook. Needs torch (``pip install
pydfccl[torch]``); ``import pydfccl`` alone never imports torch.

On CUDA tensors a collective is ordered with torch's current stream without blocking the
host (``streams.py``); on CPU tensors (the CUDA simulator, no GPU) calls are plain
synchronous ones with the same API. See docs/torch.md.
"""

from .backend import BACKEND_NAME, C10dStoreGroup, ProcessGroupDfccl, register, status_report
from .ddp import allreduce_hook
from .functional import (all_gather_into_tensor, all_reduce, all_to_all_single, broadcast,
                         get_group, irecv, isend, recv, reduce, reduce_scatter_tensor, send,
                         set_default_group)
from .group import TorchGroup
from .work import Work

__all__ = [
    "TorchGroup", "Work", "ProcessGroupDfccl", "C10dStoreGroup", "BACKEND_NAME", "register",
    "allreduce_hook", "set_default_group", "get_group", "all_reduce", "all_gather_into_tensor",
    "reduce_scatter_tensor", "broadcast", "reduce", "send", "recv", "isend", "irecv",
    "all_to_all_single", "status_report",
]

register()
