"""``late_rank.py SECONDS``: one rank of a torch job (started as torchrun starts it) in which
rank 1 comes SECONDS late to ``dist.barrier()``; the others wait there. A late rank is not
a dead one: every rank's barrier returns and an all-reduce after it is right. Prints
``RESULT <json>`` (the seconds this rank waited in the barrier, the all-reduce's values)."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import pydfccl.torch  # noqa: F401  (registers the dfccl backend)
from pydfccl import platform

late = float(sys.argv[1])
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = "cuda" if not platform.SIMULATOR and torch.cuda.is_available() else "cpu"
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
dist.init_process_group("dfccl", rank=rank, world_size=size)
warm = torch.ones(8, device=device)
dist.all_reduce(warm)                      # the group is up on every rank
if rank == 1:
    time.sleep(late)
t0 = time.monotonic()
dist.barrier()
waited = time.monotonic() - t0
t = torch.full((1024,), float(rank + 1), device=device)
dist.all_reduce(t)
# one write of the whole line: under torchrun the ranks share one pipe, and print
# writes the text and the newline apart when stdout is unbuffered
result = {"device": device, "waited": waited, "values": sorted(set(t.cpu().tolist()))}
sys.stdout.write("RESULT " + json.dumps(result) + "\n")
sys.stdout.flush()
dist.destroy_process_group()
