"""Programs a torch user writes against the "dfccl" backend, one per CASE, run by
tests/torch/test_torch_api.py under ``torchrun`` (``python api_workers.py CASE`` as each
rank). Each rank prints ``RESULT <json>`` last. ``CASE,CASE...`` runs several in order in
one process (each makes and destroys its own group) and prints their results by name."""

import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import pydfccl.torch  # noqa: F401  (registers "dfccl")


def rank_device():
    """The tensors' device, as a training script picks it: the rank's GPU where there is
    one (CUDA tensors on a GPU machine), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def calls(rank, size):
    """Every torch.distributed call a training job makes, on the default dfccl group."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    dev = rank_device()

    def full(n, value):
        return torch.full((n,), float(value), device=dev)

    dist.init_process_group("dfccl")
    pg = dist.group.WORLD
    out = {"name": pg.group_name, "backend": pg._get_backend(dev).name(),
           "device": dev.type,
           "object_device": str(dist.distributed_c10d._get_object_coll_device())}
    out["funcol"] = funcol.all_reduce(full(3, rank + 1), "sum", pg).tolist()
    out["funcol_reduce_scatter"] = funcol.reduce_scatter_tensor(
        torch.arange(2.0 * size, device=dev) + rank, "sum", 0, pg).tolist()
    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "pad": "x" * rank})
    out["objects"] = objects
    sent = [rank, "from rank"] if rank == 1 else [None, None]
    dist.broadcast_object_list(sent, src=1)
    out["broadcast_objects"] = sent
    gathered = [torch.empty(2, device=dev) for _ in range(size)] if rank == 0 else None
    dist.gather(full(2, rank), gathered, dst=0)
    out["gather"] = [t.tolist() for t in gathered] if rank == 0 else None
    part = torch.empty(2, device=dev)
    dist.scatter(part, [full(2, 10 + i) for i in range(size)] if rank == 1 else None, src=1)
    out["scatter"] = part.tolist()
    received = [torch.empty(rank + 1, device=dev) for _ in range(size)]
    dist.all_to_all(received, [full(peer + 1, 10 * rank + peer) for peer in range(size)])
    out["all_to_all"] = [t.tolist() for t in received]
    reduced = torch.empty(2, device=dev)
    dist.reduce_scatter(reduced, [full(2, i + rank) for i in range(size)])
    out["reduce_scatter"] = reduced.tolist()
    # uneven splits (MoE routing): rank r sends r + p rows of 2 to rank p
    in_splits = [rank + p for p in range(size)]
    out_splits = [p + rank for p in range(size)]
    routed = torch.empty(sum(out_splits), 2, device=dev)
    dist.all_to_all_single(routed, torch.arange(2.0 * sum(in_splits), device=dev).view(-1, 2)
                           + 100 * rank, out_splits, in_splits)
    out["all_to_allv"] = routed.view(-1).tolist()
    empty = torch.empty(0, device=dev)
    dist.all_reduce(empty)
    dist.broadcast(empty, src=0)
    dist.all_gather_into_tensor(torch.empty(0, device=dev), empty)
    out["empty_ok"] = True
    coalesced = [full(2, rank), full(3, rank + 1)]
    dist.all_reduce_coalesced(coalesced)
    out["coalesced"] = [t.tolist() for t in coalesced]
    mesh = init_device_mesh(dev.type, (size,))
    sharded = distribute_tensor(torch.arange(4.0 * size, device=dev).view(size, 4), mesh,
                                [Shard(0)])
    out["dtensor_sum"] = sharded.sum().full_tensor().item()
    out["dtensor_replicated"] = sharded.redistribute(mesh, [Replicate()]).to_local().tolist()
    out["fsdp2"] = fsdp2_step(mesh, dev)
    try:
        dist.recv(torch.empty(1, device=dev))     # from any source: dfccl names the sender
        out["any_source"] = "accepted"
    except Exception as exc:
        out["any_source"] = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    dist.destroy_process_group()
    return out


def fsdp2_step(mesh, dev):
    """One FSDP2 training step of a tiny model on ``dev``, each rank on its own batch; the
    model's output after the step, and the same step in this process alone on the mean of
    every rank's loss (the reference)."""
    from torch.distributed.fsdp import fully_shard

    def tiny():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                   torch.nn.Linear(16, 4)).to(dev)

    def batch(r):
        return torch.randn(4, 8, generator=torch.Generator().manual_seed(r)).to(dev)

    model, reference = tiny(), tiny()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(batch(dist.get_rank())).square().mean().backward()
    opt.step()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    size = dist.get_world_size()
    sum(reference(batch(r)).square().mean() for r in range(size)).div(size).backward()
    ref_opt.step()
    with torch.no_grad():
        ones = torch.ones(2, 8, device=dev)
        return [model(ones).sum().item(), reference(ones).sum().item()]


def mixed(rank, size):
    """"cpu:gloo,cuda:dfccl": CPU tensors go to gloo, the CUDA device is dfccl's."""
    dist.init_process_group("cpu:gloo,cuda:dfccl")
    pg = dist.group.WORLD
    t = torch.full((2,), rank + 1.0)
    dist.all_reduce(t)
    out = {"cpu": pg._get_backend(torch.device("cpu")).name(),
           "cuda": pg._get_backend(torch.device("cuda")).name(), "all_reduce": t.tolist()}
    dist.destroy_process_group()
    return out


def timeouts(rank, size):
    """The group's timeout bounds every wait; Work.wait(timeout) is honoured; what times
    out or fails raises torch's DistBackendError naming the rank."""
    dev = rank_device()
    dist.init_process_group("dfccl", timeout=timedelta(seconds=8))
    out = {}
    if rank == 1:
        time.sleep(3)                       # late, within the group's timeout
    t = torch.ones(2, device=dev)
    dist.all_reduce(t)
    out["late_within_timeout"] = t.tolist()
    if rank == 1:
        time.sleep(4)
    work = dist.all_reduce(torch.ones(2, device=dev), async_op=True)
    if rank == 0:
        try:
            work.wait(timeout=timedelta(seconds=0.5))
            out["short_wait"] = "completed"
        except dist.DistBackendError as exc:
            out["short_wait"] = f"{type(exc).__name__}: {exc}"
    work.wait()
    out["after_short_wait"] = "completed"
    if rank == 1:
        time.sleep(18)                      # past the group's timeout, by 10 s
    started = time.monotonic()
    try:
        dist.barrier()
        out["late_past_timeout"] = "completed"
    except dist.DistError as exc:
        out["late_past_timeout"] = f"{type(exc).__name__}: {exc}"
        out["is_pydfccl_error"] = isinstance(exc, pydfccl.PydfcclError)
    out["waited"] = time.monotonic() - started
    return out


def device_id(rank, size):
    """``init_process_group(..., device_id=)`` (a GPU machine): the group is bound to the
    rank's GPU, and torch finds the dfccl backend of that device."""
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("dfccl", device_id=device)
    pg = dist.group.WORLD
    t = torch.full((2,), rank + 1.0, device=device)
    dist.all_reduce(t)
    out = {"bound": str(pg.bound_device_id), "device": str(device),
           "backend": pg._get_backend(device).name(), "all_reduce": t.tolist()}
    dist.destroy_process_group()
    return out


def reinit(rank, size):
    """destroy_process_group() and init_process_group() again, in one process."""
    sums = []
    for round_ in range(2):
        dist.init_process_group("dfccl")
        t = torch.full((2,), rank + 1.0 + round_)
        dist.all_reduce(t)
        sums.append(t.tolist())
        dist.destroy_process_group()
    return {"sums": sums}


def main():
    cases = sys.argv[1].split(",")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    results = {case: globals()[case](rank, size) for case in cases}
    # one write of the whole line: under torchrun the ranks share one pipe, and print
    # writes the text and the newline apart when stdout is unbuffered
    result = results if len(cases) > 1 else results[cases[0]]
    sys.stdout.write("RESULT " + json.dumps(result) + "\n")
    sys.stdout.flush()
    if "timeouts" in cases:                 # a failed group cannot shut down cleanly
        os._exit(0)


if __name__ == "__main__":
    import pydfccl
    main()
