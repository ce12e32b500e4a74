"""What each rank runs in tests/torch/test_torch.py: ``python tests/torch/torch_workers.py
CASE[,CASE...]``, with torchrun's variables set by ``pydfccl.torch.spawn``, the cases in
order on one process group. Prints ``RESULT <json>`` (each case's result by its name)
last."""

import json
import os
import sys

import torch
import torch.distributed as dist

import pydfccl.torch as pt
from pydfccl.torch.stall import StallReporter
from pydfccl import platform

# CUDA tensors where pydfccl runs on a GPU, CPU tensors under the simulator.
DEV = "cuda" if not platform.SIMULATOR and torch.cuda.is_available() else "cpu"


def collectives(rank, size):
    out = {}
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    m = torch.tensor([rank + 1, 7 - rank], dtype=torch.int32)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    out["max"] = m.tolist()
    gathered = torch.empty(size * 3)
    dist.all_gather_into_tensor(gathered, torch.full((3,), float(rank)))
    out["all_gather"] = gathered.tolist()
    b = torch.arange(4, dtype=torch.int64) * (rank + 1)
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    r = torch.full((2,), float(rank + 1))
    dist.reduce(r, dst=2)
    out["reduce"] = r.tolist()
    w = dist.all_reduce(torch.ones(3, dtype=torch.bfloat16) * (rank + 1), async_op=True)
    out["bf16"] = w.get_future().wait()[0].float().tolist()
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * size) + rank)
    out["reduce_scatter"] = rs.tolist()
    a2a = torch.empty(size * 2)
    dist.all_to_all_single(a2a, torch.arange(2.0 * size) + 10 * rank)
    out["all_to_all"] = a2a.tolist()
    sends = [(rank + p) % 3 for p in range(size)]     # rank r sends rank p (r + p) % 3
    routed = torch.empty(sum((q + rank) % 3 for q in range(size)))
    pt.all_to_all_single(routed, torch.arange(float(sum(sends))) + 10 * rank,
                         [(q + rank) % 3 for q in range(size)], sends)  # the functional API
    out["all_to_allv"] = routed.tolist()
    if rank == 0:
        dist.send(torch.arange(3.0), 1)
    elif rank == 1:
        got = torch.zeros(3)
        dist.recv(got, 0)
        out["recv"] = got.tolist()
    sub = dist.new_group([0, 1], backend="dfccl")
    s = torch.ones(2) * rank
    if rank < 2:
        pt.all_reduce(s, group=sub)         # the functional API on a dfccl process group
    out["subgroup"] = s.tolist()
    dist.barrier()
    return out


def ddp(rank, size):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    reference = [p.detach().clone() for p in model.parameters()]
    ddp_model = DDP(model)
    ddp_model.register_comm_hook(None, pt.allreduce_hook)
    data = [torch.randn(5, 4, generator=torch.Generator().manual_seed(r), device="cpu").to(DEV)
            for r in range(size)]
    ddp_model(data[rank]).square().sum().backward()
    # The single-process reference: the average of every rank's gradient.
    ref_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for p, v in zip(ref_model.parameters(), reference):
            p.copy_(v)
    for x in data:
        ref_model(x).square().sum().backward()
    return {"max_diff": max((p.grad - q.grad / size).abs().max().item()
                            for p, q in zip(model.parameters(), ref_model.parameters()))}


def mismatch(rank, size):
    """On CPU the failing all_reduce raises; on CUDA it returns at once (stream-ordered) and
    the failure surfaces at the group's next call, after the stream has been released. The
    barrier first keeps a rank from meeting the failure in the case before: a mismatch aborts
    every rank's runs in flight, and a slow rank's last run of ``ddp`` could be one of them
    (its barrier may be, which this case catches)."""
    t = torch.ones(4 + rank)
    try:
        dist.barrier()
        dist.all_reduce(t)
        if t.is_cuda:
            torch.cuda.synchronize()
        dist.barrier()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"error": None}


def many_shapes(rank, size):
    """All-reduces of 100 shapes, each its own signature, and a transfer of each of 20
    more from rank 0 to rank 1: more than the group's slots (PYDFCCL_TORCH_MAX_COLLS),
    which its collectives share beyond those they keep (PYDFCCL_TORCH_SHARED_SLOTS)."""
    sums = []
    for n in range(1, 101):
        t = torch.full((n,), float(rank + 1))
        dist.all_reduce(t)
        sums.append(float(t.sum()))
    received = []
    for n in range(1, 21):
        if rank == 0:
            dist.send(torch.full((n,), 7.0), dst=1)
        elif rank == 1:
            r = torch.zeros(n)
            dist.recv(r, src=0)
            received.append(float(r.sum()))
    return {"sums": sums, "received": received,
            "shared_slots": [s["shared_slots"] for s in pt.stats()]}


def main():
    cases = sys.argv[1].split(",")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if DEV == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    torch.set_default_device(DEV)
    # Report where this rank waits (and its stacks) before the test's timeout kills it.
    stall = StallReporter(rank, float(os.environ.get("PYDFCCL_TEST_STALL", "90")),
                          report=pt.status_report, exit_code=4)
    dist.init_process_group("dfccl", rank=rank, world_size=size)
    result = {}
    for case in cases:
        stall.enter(case)
        result[case] = globals()[case](rank, size)
    print("RESULT " + json.dumps(result), flush=True)
    if "mismatch" not in cases:        # a failed group cannot shut down cleanly
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
