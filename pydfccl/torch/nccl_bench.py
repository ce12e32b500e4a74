"""The NCCL baseline of ``python -m pydfccl bench --baseline torch``: the same sweep through
``torch.distributed``, one process per rank, in the same run as pydfccl's.

NCCL refuses two ranks on one GPU, so it runs only where there is a GPU per rank; the
``gloo`` backend (CPU tensors) runs the same code anywhere, which is how CI checks it. Each
rank times ``iters`` back-to-back calls after ``warmup`` ones, between two device
synchronizations (as nccl-tests does), then runs once more from fresh inputs and checks
that result against pydfccl's reference; the sweep keeps the slowest rank's time.

Run by ``run_torch_sweep``; each rank is ``python -m pydfccl.torch.nccl_bench OPTIONS_JSON``.
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["run_torch_sweep", "torch_baseline_unavailable"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def torch_baseline_unavailable(coll: str, nranks: int, backend: str) -> str | None:
    """Why the baseline cannot run here, or None."""
    if coll not in KINDS:
        return f"{coll} is not a collective of the sweep's torch baseline"
    try:
        import torch
    except ImportError:
        return "torch is not installed (pip install pydfccl[torch])"
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < nranks:
            return (f"NCCL needs a GPU per rank: {gpus} GPU(s) here for {nranks} ranks (it "
                    "refuses two ranks on one GPU)")
    return None


def run_torch_sweep(opts, steps: list, backend: str = "nccl", timeout: float = 1800) -> list:
    """Per rank, per size (in the order of ``steps``): ``dict(seconds=..., wrong=...)``,
    the seconds per run and the wrong elements (-1: not checked), as ``sweep_worker``."""
    from .spawn import spawn_ranks

    spec = dict(coll=opts.coll, dtype=opts.dtype, op=opts.op, root=opts.root,
                iters=opts.iters, warmup=opts.warmup, check=opts.check, steps=steps,
                backend=backend)
    results = spawn_ranks(["-m", "pydfccl.torch.nccl_bench", json.dumps(spec)], opts.nranks,
                          timeout=timeout, capture=True)
    per_rank = []
    for rank, r in enumerate(results):
        lines = [line for line in r.stdout.splitlines() if line.startswith("RESULT ")]
        if r.returncode != 0 or not lines:
            raise RuntimeError(f"torch baseline, rank {rank} exited {r.returncode}:\n"
                               f"{r.stderr[-2000:]}")
        per_rank.append(json.loads(lines[-1][len("RESULT "):]))
    return per_rank


def _call(dist, spec, send, recv, op):
    coll, root = spec["coll"], spec["root"]
    if coll == "all_reduce":
        dist.all_reduce(send, op=op)
    elif coll == "all_gather":
        dist.all_gather_into_tensor(recv, send)
    elif coll == "reduce_scatter":
        dist.reduce_scatter_tensor(recv, send, op=op)
    elif coll == "broadcast":
        dist.broadcast(send, src=root)
    elif coll == "reduce":
        dist.reduce(send, dst=root, op=op)
    else:
        dist.all_to_all_single(recv, send)


def _tensor(torch, values, device):
    """A torch tensor of numpy ``values`` (bfloat16 through float32: numpy has none)."""
    if values.dtype.name == "bfloat16":
        return torch.from_numpy(values.astype("float32")).to(device).to(torch.bfloat16)
    return torch.from_numpy(values).to(device)


def _array(tensor):
    """A host numpy copy (bfloat16 as float32)."""
    import torch
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.cpu().numpy()


def _rank_main(spec: dict) -> list:
    import numpy as np
    import torch
    import torch.distributed as dist

    from ..protocol.reference import buffer_elems, reference
    from ..cli.sweep_spec import sweep_input
    from .convert import torch_op

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = spec["backend"] == "nccl"
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dist.init_process_group(spec["backend"], rank=rank, world_size=size)
    op = torch_op(spec["op"])
    in_place = spec["coll"] in ("all_reduce", "broadcast", "reduce")
    rows = []
    for _, count in spec["steps"]:
        send_elems, recv_elems = buffer_elems(spec["coll"], count, size)
        fresh = _tensor(torch, sweep_input(rank, send_elems, spec["dtype"]), device)
        send = fresh.clone()
        recv = send if in_place else torch.empty(recv_elems, dtype=send.dtype, device=device)
        for _ in range(spec["warmup"]):
            _call(dist, spec, send, recv, op)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(spec["iters"]):
            _call(dist, spec, send, recv, op)
        sync()
        seconds = (time.perf_counter() - t0) / max(1, spec["iters"])
        wrong = -1
        if spec["check"]:        # once more, from fresh inputs (in place runs accumulate)
            send.copy_(fresh)
            _call(dist, spec, send, recv, op)
            sync()
            want = reference(spec["coll"], [sweep_input(r, send_elems, spec["dtype"])
                                            for r in range(size)], spec["op"], spec["root"],
                             rank)
            got = _array(recv)
            wrong = 0 if want is None else int(np.count_nonzero(
                got[:want.size] != want.astype(got.dtype)))
        rows.append(dict(seconds=seconds, wrong=wrong))
    dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    print("RESULT " + json.dumps(_rank_main(json.loads(sys.argv[1]))), flush=True)
