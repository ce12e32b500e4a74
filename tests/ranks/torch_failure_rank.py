"""One rank of the torch fault rows (tests/ranks/test_faults.py on CPU tensors,
tests/torch/test_torch_faults.py on CUDA tensors), run as ``torchrun`` runs it (by
``pydfccl.torch.spawn``): rank 1 ends its process without closing anything, while the others
are in an all-reduce. ``torch_failure_rank.py [cpu|cuda] [async|sync]``: the tensors' device,
and whether the all-reduce is waited for with ``wait()`` or is a blocking call. Prints
``RESULT <json>`` with what they saw."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist

import pydfccl.torch  # noqa: F401  (registers the dfccl backend)

args = sys.argv[1:]
device = args[0] if args else "cpu"
form = args[1] if len(args) > 1 else "async"
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
torch.set_default_device(device)
dist.init_process_group("dfccl", rank=rank, world_size=size)
warm = torch.ones(8)
dist.all_reduce(warm)                      # the group is up on every rank
if rank == 1:
    time.sleep(3)                          # its peers are in the all-reduce by then
    os._exit(0)                            # gone without closing anything
t = torch.full((4096,), float(rank + 1))
seen = {"at": "submit"}
try:
    if form == "sync":
        dist.all_reduce(t)                 # returns only with the sum in t
    else:
        work = dist.all_reduce(t, async_op=True)
        seen["at"] = "wait"
        work.wait()
    seen["first"] = "completed?!"
    seen["after"] = t.sum().item()         # a kernel that reads t: it must never run
except Exception as exc:
    seen["first"] = f"{type(exc).__name__}: {exc}"
if device == "cpu":                        # device memory is left undefined: not read
    seen["all_nan"] = bool(torch.isnan(t).all())
try:
    dist.all_reduce(torch.ones(4))
    seen["later"] = "completed?!"
except Exception as exc:
    seen["later"] = f"{type(exc).__name__}: {exc}"
# one write of the whole line: under torchrun the ranks share one pipe, and print
# writes the text and the newline apart when stdout is unbuffered
sys.stdout.write("RESULT " + json.dumps(seen) + "\n")
sys.stdout.flush()
os._exit(0)                                # a failed group cannot shut down cleanly
