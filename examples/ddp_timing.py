"""Iteration time of data-parallel training with pydfccl's DDP hook against pydfccl's
functional all-reduce called by hand, in the same run and on the same model and data.

    python examples/ddp_timing.py --nranks 2 --steps 30          # spawns its ranks
    torchrun --nproc-per-node 2 examples/ddp_timing.py

Both modes train an MLP of --layers x --width from the same weights on the same batches:
- ``hook``: ``DistributedDataParallel`` with ``register_comm_hook(None,
  pydfccl.torch.allreduce_hook)``; DDP buckets the gradients (--bucket-mb) and overlaps
  their all-reduces with the rest of backward;
- ``manual``: the plain model; after backward every gradient is copied into one flat
  buffer, averaged with ``pydfccl.torch.all_reduce(flat, op=AVG)`` and copied back.

Rank 0 prints a table (median, p10 and p90 of the iteration time over the steps after
--warmup) and the hook's time over the manual one. The two modes' weights must agree at the
end (to 1e-5) and be the same on every rank (each trains on its own batches), else the
exit status is 1. Without a GPU it runs on the CUDA simulator.
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, default=2, help="ranks to spawn (without torchrun)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per mode")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per mode")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=64, help="sequences per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--timeout", type=float, default=None, help="bound on the spawned job")
    p.add_argument("--stall", type=float, default=60.0,
                   help="seconds in one phase after which a rank reports where it waits and "
                        "exits 3")
    return p.parse_args(argv)


def make_model(torch, layers, width, device):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*mods).to(device)


def train(torch, model, step_fn, batches, warmup, sync, stall, mode):
    """Run every batch through ``step_fn``; the times of those after ``warmup``."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for i, (x, y) in enumerate(batches):
        stall.enter(f"{mode} step {i}")
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        step_fn(model)
        opt.step()
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def rank_main(args) -> int:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import pydfccl.torch as pt
    from pydfccl import platform
    from pydfccl.torch.stall import StallReporter

    rank, nranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = args.device == "cuda" or (args.device == "auto" and not platform.SIMULATOR
                                     and torch.cuda.is_available())
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    stall = StallReporter(rank, args.stall, report=pt.status_report)
    dist.init_process_group("dfccl", rank=rank, world_size=nranks)

    g = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(args.batch, args.width, generator=g).to(device),
                torch.randn(args.batch, args.width, generator=g).to(device))
               for _ in range(args.warmup + args.steps)]

    stall.enter("DDP's construction (it broadcasts the weights)")
    hooked = DDP(make_model(torch, args.layers, args.width, device),
                 bucket_cap_mb=args.bucket_mb)
    hooked.register_comm_hook(None, pt.allreduce_hook)
    hook_times = train(torch, hooked, lambda m: None, batches, args.warmup, sync, stall,
                       "hook")

    def average_by_hand(model):
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([gr.reshape(-1) for gr in grads])
        pt.all_reduce(flat, op=dist.ReduceOp.AVG)
        offset = 0
        for gr in grads:
            gr.copy_(flat[offset:offset + gr.numel()].view_as(gr))
            offset += gr.numel()

    manual = make_model(torch, args.layers, args.width, device)
    manual_times = train(torch, manual, average_by_hand, batches, args.warmup, sync,
                         stall, "manual")

    stall.enter("the final checks")
    diff = max((p - q).abs().max().item()
               for p, q in zip(hooked.module.parameters(), manual.parameters()))
    spread = max(rank_spread(torch, dist, pt, hooked.module), rank_spread(torch, dist, pt, manual))
    ok = diff <= 1e-5 and spread <= 1e-6
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        nparams = sum(p.numel() for p in manual.parameters())
        print(f"{nranks} ranks on {device.type}, MLP {args.layers} x {args.width} "
              f"({nparams * 4 / 2**20:.1f} MiB of float32 gradients), batch {args.batch} "
              f"per rank, {args.steps} timed steps per mode")
        print(f"{'mode':<8} {'median ms':>10} {'p10 ms':>8} {'p90 ms':>8}")
        rows = {"hook": hook_times, "manual": manual_times}
        for name, ts in rows.items():
            q = np.percentile(np.array(ts) * 1e3, [50, 10, 90])
            print(f"{name:<8} {q[0]:>10.2f} {q[1]:>8.2f} {q[2]:>8.2f}")
        ratio = np.median(hook_times) / np.median(manual_times)
        print(f"hook / manual: {ratio:.2f}x; the modes' weights agree to {diff:.1e}, the "
              f"ranks' to {spread:.1e} ({'ok' if ok else 'WRONG'})", flush=True)
    return 0 if ok else 1


def rank_spread(torch, dist, pt, model) -> float:
    """The largest difference of a weight between ranks (0 when the gradients were
    averaged: every rank trains on different batches)."""
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lo, hi = w.clone(), w.clone()
    pt.all_reduce(lo, op=dist.ReduceOp.MIN)
    pt.all_reduce(hi, op=dist.ReduceOp.MAX)
    return (hi - lo).max().item()


def main(argv=None) -> int:
    from pydfccl.torch.spawn import run_as_ranks

    args = parse(argv)
    return run_as_ranks(__file__, argv, args.nranks, lambda: rank_main(args),
                        timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
