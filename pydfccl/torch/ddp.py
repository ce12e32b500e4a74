"""A DDP communication hook that averages gradient buckets through pydfccl.

    model.register_comm_hook(group, pydfccl.torch.allreduce_hook)

``group`` is a TorchGroup, a "dfccl" process group, or None (the default group). The
bucket is averaged in place with op "avg" (sum, then divided by the group size, as
NCCL's avg does) and the hook returns the ``torch.futures.Future`` that DDP waits on
(annotated as DDP checks: no ``from __future__ import annotations`` here)."""

import torch
import torch.distributed as dist

from .functional import get_group

__all__ = ["allreduce_hook"]


def allreduce_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    group = get_group(state)
    buffer = bucket.buffer()
    work = group.run("all_reduce", buffer, None, count=buffer.numel(), op="avg",
                     async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
