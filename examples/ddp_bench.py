"""Training steps a second of the same DDP program on several torch.distributed backends,
side by side in one run.

    python examples/ddp_bench.py --nranks 2                        # gloo and dfccl on CPU
    python examples/ddp_bench.py --nranks 2 --backends nccl,gloo,dfccl --device cuda

NCCL runs one rank a GPU: with fewer GPUs than --nranks it runs as many ranks as there are
GPUs (one on a one-GPU machine, where gloo and dfccl share the GPU among their rank
processes), its row says so, and its weights are left out of the comparison (another number
of ranks trains on other batches).

The program is plain DDP (no communication hook) of a small transformer language model
(--layers x --d-model, 4.2 million parameters by default) on synthetic tokens, the
same for every backend: only the name given to ``init_process_group`` changes. For each
backend the command starts --nranks rank processes (as torchrun would), trains --warmup
untimed and --steps timed steps, and rank 0 reports steps a second and the loss. The table
also checks that every backend ends with the same loss (the same weights and batches).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="gloo,dfccl", help="comma-separated backends")
    p.add_argument("--nranks", type=int, default=2, help="rank processes per backend")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--seq", type=int, default=64, help="tokens a sequence")
    p.add_argument("--batch", type=int, default=8, help="sequences a rank a step")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--timeout", type=float, default=1800, help="bound on each backend's run")
    p.add_argument("--rank-backend", help=argparse.SUPPRESS)    # set in the rank processes
    return p.parse_args(argv)


def make_model(torch, args):
    """A small causal transformer language model (embedding, encoder layers, head)."""
    torch.manual_seed(0)

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(args.vocab, args.d_model)
            layer = torch.nn.TransformerEncoderLayer(args.d_model, nhead=4,
                                                     dim_feedforward=4 * args.d_model,
                                                     batch_first=True, dropout=0.0)
            self.blocks = torch.nn.TransformerEncoder(layer, args.layers,
                                                      enable_nested_tensor=False)
            self.head = torch.nn.Linear(args.d_model, args.vocab)

        def forward(self, tokens):
            mask = torch.nn.Transformer.generate_square_subsequent_mask(
                tokens.shape[1], device=tokens.device)
            return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))

    return LM()


def ranks_for(backend: str, args, gpus: int) -> int:
    """The rank processes ``backend`` runs: --nranks, but NCCL on CUDA at most one a GPU."""
    if backend == "nccl" and args.device == "cuda":
        return max(1, min(args.nranks, gpus))
    return args.nranks


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if args.rank_backend == "dfccl":
        import pydfccl.torch  # noqa: F401  (registers "dfccl")
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group(args.rank_backend, rank=rank, world_size=size)
    model = make_model(torch, args).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    losses, start = [], None
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=gen).to(device)
        logits = ddp(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab),
                                                 tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    # the weights every rank ends with, in one number (the same on every rank)
    checksum = sum(p.detach().double().sum().item() for p in model.parameters())
    if rank == 0:
        print("RESULT " + json.dumps(dict(
            steps_per_s=args.steps / elapsed, params=sum(p.numel() for p in model.parameters()),
            first_loss=losses[0], last_loss=losses[-1], checksum=checksum)), flush=True)
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.rank_backend:
        return rank_main(args)
    from pydfccl.torch.spawn import spawn_ranks

    gpus = 0
    if args.device == "cuda":
        import torch
        gpus = torch.cuda.device_count()
    rows = []
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    for backend in args.backends.split(","):
        nranks = ranks_for(backend, args, gpus)
        results = spawn_ranks([os.path.abspath(__file__), *forwarded, "--rank-backend",
                               backend], nranks, timeout=args.timeout, capture=True)
        if any(r.returncode for r in results):
            print(f"{backend}: ranks exited with {[r.returncode for r in results]}\n"
                  + "\n".join(r.stderr[-2000:] for r in results), file=sys.stderr)
            return 1
        line = [l for l in results[0].stdout.splitlines() if l.startswith("RESULT ")][-1]
        rows.append((backend, nranks, json.loads(line[len("RESULT "):])))
    print(f"DDP, {args.device}, a {args.layers}-layer transformer of "
          f"{rows[0][2]['params']:,} parameters, {args.batch} x {args.seq} tokens a rank")
    print(f"{'backend':<8} {'ranks':>5} {'steps/s':>9} {'loss first':>11} {'loss last':>10}")
    for backend, nranks, r in rows:
        print(f"{backend:<8} {nranks:>5} {r['steps_per_s']:>9.3f} {r['first_loss']:>11.4f} "
              f"{r['last_loss']:>10.4f}")
    compared = [(b, r) for b, n, r in rows if n == args.nranks]
    for backend, nranks, _ in rows:
        if nranks != args.nranks:
            print(f"{backend}: {nranks} rank(s), one a GPU; its weights are not compared")
    if len(compared) < 2:
        return 0
    spread = max(r["checksum"] for _, r in compared) - min(r["checksum"] for _, r in compared)
    scale = max(abs(r["checksum"]) for _, r in compared) or 1.0
    same = spread <= 1e-4 * scale
    print(f"the final weights of {', '.join(b for b, _ in compared)} agree to {spread:.2e} "
          f"(checksum) ({'ok' if same else 'DIFFER'})")
    return 0 if same else 1

if __name__ == "__main__":
    sys.exit(main())
