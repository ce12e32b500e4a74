"""``python spawn_worker.py N``: N ranks by ``torch.multiprocessing.spawn``, each joining
with ``init_process_group("dfccl", rank=, world_size=)``, as torch's tutorials do."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import pydfccl.torch  # noqa: F401
from pydfccl.torch.spawn import free_port


def run(rank, world_size, port):
    dist.init_process_group("dfccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    # one write of the whole line: print writes the text and the newline apart, and the
    # ranks share the pipe, so two ranks' lines could interleave
    sys.stdout.write(f"rank{rank}:{t[0].item()}\n")
    sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    assert "RANK" not in os.environ
    n = int(sys.argv[1])
    mp.spawn(run, args=(n, free_port()), nprocs=n)
