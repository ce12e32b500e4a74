"""Train a small GPT-style transformer with data parallelism and tensor parallelism whose
collectives are issued in rank-dependent orders with implicit GPU syncs between them.

    python examples/train_gpt.py --nranks 4 --steps 20          # spawns its ranks
    torchrun --nproc-per-node 4 examples/train_gpt.py --steps 20

Ranks form a grid: tensor-parallel groups of --tp consecutive ranks (the MLP is split
Megatron-style: each rank holds a slice of its hidden units and the partial outputs are
all-reduced) and data-parallel groups across them (gradients averaged). After backward,
each rank issues its data-parallel gradient all-reduce and a tensor-parallel all-reduce
(the squared gradient norm) asynchronously, in an order that depends on the rank, with a
device synchronize and a ``.item()`` between the two: the pattern that deadlocks real jobs.
With 4 ranks the waits form a cycle 0 -> 2 -> 3 -> 1 -> 0. With ``--tp 1`` (data
parallelism only) the norm goes over a second group of all ranks instead (a metrics group),
and 2 ranks already form a cycle. With NCCL (``--backend nccl``, one GPU per rank) the job
hangs and this script's watchdog reports it and exits 3; so it does with torch's CPU backend
(``--backend gloo``, where the sync between the issues is a wait for the first collective,
what a device sync waits for). With pydfccl the daemons preempt and quit, so every sync
completes and the job trains.

The first --check-steps steps are checked against a single-process reference (the same
model, unsplit, on the whole batch): the loss and every parameter after the step.

Without a GPU it runs on the CUDA simulator (CPU tensors); ``--device cuda`` needs CUDA
IPC between rank processes (and MPS for several ranks on one GPU).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

VOCAB, SEQ, DIM, HIDDEN, HEADS = 16, 8, 16, 32, 2


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nranks", type=int, default=4, help="ranks to spawn (without torchrun)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel group size")
    p.add_argument("--batch", type=int, default=8, help="global batch (sequences)")
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--backend", choices=("dfccl", "nccl", "gloo"), default="dfccl",
                   help="gloo: torch's CPU backend, where the job deadlocks as under NCCL")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--check-steps", type=int, default=3,
                   help="steps verified against the single-process reference")
    p.add_argument("--watchdog", type=float, default=120.0,
                   help="seconds without a finished step after which the job is reported stuck")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None, help="bound on the spawned job")
    return p.parse_args(argv)


# -- the model ---------------------------------------------------------------------------

def build(torch, tp_rank=0, tp=1, seed=0):
    """The model's parameters; with tp > 1 only this rank's slice of the MLP."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale)

    full = dict(tok=rand(VOCAB, DIM, scale=0.5), pos=rand(SEQ, DIM, scale=0.5),
                qkv=rand(DIM, 3 * DIM, scale=DIM ** -0.5), proj=rand(DIM, DIM, scale=DIM ** -0.5),
                w1=rand(DIM, HIDDEN, scale=DIM ** -0.5), w2=rand(HIDDEN, DIM, scale=HIDDEN ** -0.5),
                head=rand(DIM, VOCAB, scale=DIM ** -0.5))
    part = HIDDEN // tp
    full["w1"] = full["w1"][:, tp_rank * part:(tp_rank + 1) * part]
    full["w2"] = full["w2"][tp_rank * part:(tp_rank + 1) * part, :]
    return {k: v.contiguous().requires_grad_() for k, v in full.items()}


def forward(torch, params, tokens, mlp_reduce=None):
    """Next-token loss. ``mlp_reduce`` sums the MLP's partial outputs over the
    tensor-parallel group (forward all-reduce, backward identity: Megatron's g), and the
    MLP's input gradient is summed the same way on the way back (Megatron's f)."""
    F = torch.nn.functional
    x = params["tok"][tokens[:, :-1]] + params["pos"][: SEQ - 1]
    b, t, _ = x.shape
    q, k, v = (x @ params["qkv"]).split(DIM, dim=-1)
    heads = lambda z: z.view(b, t, HEADS, DIM // HEADS).transpose(1, 2)  # noqa: E731
    att = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
    x = x + att.transpose(1, 2).reshape(b, t, DIM) @ params["proj"]
    h = x if mlp_reduce is None else mlp_reduce.copy_in(x)
    part = torch.relu(F.layer_norm(h, (DIM,)) @ params["w1"]) @ params["w2"]
    x = x + (part if mlp_reduce is None else mlp_reduce.reduce_out(part))
    logits = F.layer_norm(x, (DIM,)) @ params["head"]
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def batch(torch, step, size, seed):
    """Synthetic sequences with a rule to learn: each token is the previous plus 1 or 3."""
    g = torch.Generator().manual_seed(seed * 100003 + step)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    stride = 1 + 2 * torch.randint(0, 2, (size, 1), generator=g)
    return (start + stride * torch.arange(SEQ)) % VOCAB


def tp_functions(torch, dist_ops, tp_group):
    """Megatron's f and g as autograd functions over ``tp_group``."""

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous().clone()
            dist_ops.all_reduce(x, group=tp_group)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist_ops.all_reduce(grad, group=tp_group)
            return grad

    class Ops:
        copy_in = staticmethod(Copy.apply)
        reduce_out = staticmethod(Reduce.apply)

    return Ops


# -- one rank -----------------------------------------------------------------------------

def rank_main(args) -> int:
    import torch
    import torch.distributed as dist

    from pydfccl.torch.stall import StallReporter

    rank, nranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if nranks % args.tp or args.batch % (nranks // args.tp):
        print(f"--tp {args.tp} must divide {nranks} ranks, and the data-parallel size the "
              f"batch {args.batch}", file=sys.stderr)
        return 2
    if args.backend == "dfccl":
        import pydfccl.torch  # (registers the backend)
        from pydfccl import platform
        simulated = platform.SIMULATOR
    else:
        simulated = False
    device = torch.device("cuda" if args.backend != "gloo" and (
        args.device == "cuda" or (args.device == "auto" and not simulated
                                  and torch.cuda.is_available())) else "cpu")
    # gloo has no AVG: it sums, and the mean is taken after the wait
    avg = dist.ReduceOp.SUM if args.backend == "gloo" else dist.ReduceOp.AVG
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    # NCCL jobs hang; this one reports a stuck phase (with pydfccl, what each rank waits
    # for, and every thread's stack) and exits 3.
    watchdog = StallReporter(rank, args.watchdog,
                             report=pydfccl.torch.status_report if args.backend == "dfccl"
                             else None)
    torch.manual_seed(args.seed)
    dist.init_process_group(args.backend, rank=rank, world_size=nranks)

    tp, dp = args.tp, nranks // args.tp
    tp_rank, dp_rank = rank % tp, rank // tp
    tp_groups = [dist.new_group(list(range(i * tp, (i + 1) * tp)), backend=args.backend)
                 for i in range(dp)]
    dp_groups = [dist.new_group(list(range(j, nranks, tp)), backend=args.backend)
                 for j in range(tp)]
    tp_group, dp_group = tp_groups[dp_rank], dp_groups[tp_rank]
    # The squared gradient norm is summed over the tensor-parallel group (each rank holds a
    # slice of the MLP). Without tensor parallelism it is averaged over a second group of
    # all ranks, a metrics group as jobs keep for logging, so that two ranks (two GPUs under
    # NCCL) already form the cycle.
    if tp > 1:
        norm_group, norm_op, norm_name = tp_group, dist.ReduceOp.SUM, "tensor-parallel"
    else:
        norm_group = dist.new_group(list(range(nranks)), backend=args.backend)
        norm_op, norm_name = avg, "metrics"

    def device_sync(issued):
        """An implicit sync as frameworks make them: ``torch.cuda.synchronize()``; under the
        simulator the communicator's own device synchronize; on gloo a wait for the
        collective ``issued``, the work a device sync would wait for."""
        if device.type == "cuda":
            torch.cuda.synchronize()
        elif args.backend == "gloo":
            issued.wait()
        else:
            dist_group_of(dp_group).synchronize_device()

    def dist_group_of(group):
        return group.dfccl_group if hasattr(group, "dfccl_group") else None

    params = {k: v.detach().to(device).requires_grad_() for k, v in
              build(torch, tp_rank, tp, args.seed).items()}
    ref = build(torch, 0, 1, args.seed) if args.check_steps else None
    ops = tp_functions(torch, dist, tp_group) if tp > 1 else None
    local = args.batch // dp
    dp_first = (tp_rank + dp_rank) % 2 == 0
    losses, worst = [], 0.0
    for step in range(args.steps):
        tokens = batch(torch, step, args.batch, args.seed)
        mine = tokens[dp_rank * local:(dp_rank + 1) * local].to(device)
        watchdog.enter(f"step {step} forward/backward")
        loss = forward(torch, params, mine, ops)
        loss.backward()
        grads = torch.cat([p.grad.reshape(-1) for p in params.values()])
        sq_norm = sum((params[k].grad.float() ** 2).sum() for k in ("w1", "w2")).reshape(1)

        def issue_dp():
            return dist.all_reduce(grads, op=avg, group=dp_group, async_op=True)

        def issue_norm():
            return dist.all_reduce(sq_norm, op=norm_op, group=norm_group, async_op=True)

        watchdog.enter(f"step {step} gradient collectives "
                       f"({'data-parallel' if dp_first else norm_name} first)")
        first = issue_dp() if dp_first else issue_norm()
        device_sync(first)                # implicit syncs between the two issues
        local_loss = loss.item()
        second = issue_norm() if dp_first else issue_dp()
        first.wait()
        second.wait()
        mean_loss = torch.tensor([local_loss], device=device)
        dist.all_reduce(mean_loss, op=avg, group=dp_group)
        if avg == dist.ReduceOp.SUM:
            grads /= dp
            mean_loss /= dp
            if tp == 1:
                sq_norm /= nranks
        offset = 0
        with torch.no_grad():
            for p in params.values():
                p -= args.lr * grads[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.grad = None
        losses.append(mean_loss.item())
        if step < args.check_steps:
            worst = max(worst, check_against_reference(torch, ref, params, tokens, args,
                                                       losses[-1], tp_rank, tp))
        if rank == 0:
            print(f"step {step:3d}  loss {losses[-1]:.4f}  grad-norm(mlp) "
                  f"{math.sqrt(sq_norm.item()):.4f}", flush=True)
    watchdog.enter("shutdown")
    dist.barrier()
    if args.backend == "dfccl" and rank == 0:
        groups = pydfccl.torch.stats()
        print(f"pydfccl on rank 0: {len(groups)} groups, "
              f"{sum(g['completed'] for g in groups)} collectives, "
              f"{sum(g['preemptions'] for g in groups)} preemptions, "
              f"{sum(g['relaunches'] for g in groups)} daemon relaunches", flush=True)
    dist.destroy_process_group()
    ok_ref = worst <= 1e-4
    ok_loss = losses[-1] < losses[0]
    if rank == 0:
        print(f"verified {min(args.check_steps, args.steps)} steps against the single-process "
              f"reference: max difference {worst:.2e} ({'ok' if ok_ref else 'WRONG'}); loss "
              f"{losses[0]:.4f} -> {losses[-1]:.4f} ({'decreasing' if ok_loss else 'NOT decreasing'})",
              flush=True)
    return 0 if ok_ref and ok_loss else 1


def check_against_reference(torch, ref, params, tokens, args, loss, tp_rank, tp) -> float:
    """One SGD step of the unsplit model on the whole batch; the largest difference from
    this rank's loss and parameters (its slice of the MLP)."""
    ref_loss = forward(torch, ref, tokens)
    ref_loss.backward()
    with torch.no_grad():
        for p in ref.values():
            p -= args.lr * p.grad
            p.grad = None
    part = HIDDEN // tp
    worst = abs(ref_loss.item() - loss)
    for k, p in params.items():
        want = ref[k]
        if k == "w1":
            want = want[:, tp_rank * part:(tp_rank + 1) * part]
        elif k == "w2":
            want = want[tp_rank * part:(tp_rank + 1) * part, :]
        worst = max(worst, (p.detach().cpu() - want).abs().max().item())
    return worst


def main(argv=None) -> int:
    from pydfccl.torch.spawn import run_as_ranks

    args = parse(argv)
    return run_as_ranks(__file__, argv, args.nranks, lambda: rank_main(args),
                        timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
