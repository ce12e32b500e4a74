"""pydfccl for PyTorch: torch.distributed's collectives on torch tensors, a "dfccl"
process-group backend, and a DDP communication hook. Needs torch (``pip install
pydfccl[torch]``); ``import pydfccl`` alone never imports torch.

On CUDA tensors a collective starts once torch's current stream has made its inputs,
without blocking the host (``run(..., stream=)``), and ``wait()`` waits on the host; on
CPU tensors (the CUDA simulator, no GPU) calls are plain synchronous ones with the same
API.
See docs/torch.md.
"""

import os as _os

# ``import pydfccl`` (which comes first) asked for eager kernel loading (see there).
from .backend import (BACKEND_NAME, C10dStoreGroup, ProcessGroupDfccl, register, stats,
                      status_report)
from .ddp import allreduce_hook
from .errors import DfcclError, DfcclTimeoutError
from .functional import (all_gather_into_tensor, all_reduce, all_to_all_single, broadcast,
                         get_group, irecv, isend, recv, reduce, reduce_scatter_tensor, send,
                         set_default_group)
from .group import TorchGroup
from .work import Work

__all__ = [
    "TorchGroup", "Work", "DfcclError", "DfcclTimeoutError", "ProcessGroupDfccl", "C10dStoreGroup", "BACKEND_NAME", "register",
    "allreduce_hook", "set_default_group", "get_group", "all_reduce", "all_gather_into_tensor",
    "reduce_scatter_tensor", "broadcast", "reduce", "send", "recv", "isend", "irecv",
    "all_to_all_single", "status_report", "stats",
]


def _warn_if_lazy_loading() -> None:
    """Say so when CUDA started before this module could ask for eager loading."""
    import warnings

    import torch

    if torch.cuda.is_initialized() and _os.environ.get("CUDA_MODULE_LOADING") != "EAGER":
        warnings.warn("pydfccl.torch: CUDA was initialized before pydfccl.torch was imported, "
                      "with lazy kernel loading: a torch kernel's first launch may then wait "
                      "for a collective that waits for it. Import pydfccl.torch first, or "
                      "set CUDA_MODULE_LOADING=EAGER.", RuntimeWarning, stacklevel=3)


register()
_warn_if_lazy_loading()
