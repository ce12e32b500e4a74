"""One rank of tests/ranks/test_faults.py's torch row, run as ``torchrun`` runs it (by
``pydfccl.torch.spawn``): rank 1 ends its process without closing anything, while the others
are in an all-reduce on CPU tensors. Prints ``RESULT <json>`` with what they saw."""

import json
import os
import time

import torch
import torch.distributed as dist

import pydfccl.torch  # noqa: F401  (registers the dfccl backend)

rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("dfccl", rank=rank, world_size=size)
warm = torch.ones(8)
dist.all_reduce(warm)                      # the group is up on every rank
if rank == 1:
    time.sleep(3)                          # its peers are in the all-reduce by then
    os._exit(0)                            # gone without closing anything
t = torch.full((4096,), float(rank + 1))
seen = {"at": "submit"}
try:
    work = dist.all_reduce(t, async_op=True)
    seen["at"] = "wait"
    work.wait()
    seen["first"] = "completed?!"
except Exception as exc:
    seen["first"] = f"{type(exc).__name__}: {exc}"
seen["all_nan"] = bool(torch.isnan(t).all())
try:
    dist.all_reduce(torch.ones(4))
    seen["later"] = "completed?!"
except Exception as exc:
    seen["later"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(seen), flush=True)
os._exit(0)                                # a failed group cannot shut down cleanly
