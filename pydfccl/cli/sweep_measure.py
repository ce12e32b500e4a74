"""The size sweep's measuring: each mode's runs on the ranks, timed size by size, and the
cycles of ``-N`` with the modes taking turns (``python -m pydfccl bench``; the options and
inputs are ``pydfccl.cli.sweep_spec``'s)."""

from __future__ import annotations

import sys
import time

import numpy as np

from ..bootstrap.group import close_all, init_all, start_all
from ..bootstrap.launch import default_backend, launch
from ..host.gcpause import gc_paused
from ..host.world_config import on_gpu
from ..protocol.reference import buffer_elems
from .sweep_spec import (SAME_FOR_EVERY_RANK, SweepOptions, bus_factor, expected_output, sizes,
                         sweep_input)

__all__ = ["BASELINES", "BASELINE_CHOICES", "bench_modes", "all_ranks_on_this_gpu",
           "sweep_ranks", "sweep_worker", "one_thread_sweep", "run_sweep", "run_cycles"]

BASELINES = {"launch": dict(policy="nccl", persistent=False), "nccl": dict(policy="nccl")}
# --baseline's choices: the modes each adds after the daemon's
BASELINE_CHOICES = {"none": [], "launch": ["launch"], "nccl": ["nccl"],
                    "both": ["launch", "nccl"], "torch": ["torch"],
                    "all": ["launch", "nccl", "torch"]}


def bench_modes(baseline: str, torch_backend: str, coll: str, nranks: int) -> tuple:
    """The modes ``--baseline`` asks for, the daemon's first, with torch's named by its
    backend (``NCCL`` or ``gloo``); and why the torch baseline was left out (None: it was
    not, or not asked for)."""
    modes = ["daemon"] + BASELINE_CHOICES[baseline]
    if "torch" not in modes:
        return modes, None
    from ..torch.nccl_bench import torch_baseline_unavailable

    modes.remove("torch")
    why = torch_baseline_unavailable(coll, nranks, torch_backend)
    if not why:
        modes.append("NCCL" if torch_backend == "nccl" else "gloo")
    return modes, why


def all_ranks_on_this_gpu(backend: str | None) -> bool:
    """A GPU, and the ranks as threads on it: what the one-thread driver and the HBM table
    need."""
    return on_gpu() and (backend or default_backend()) == "threads"


def sweep_ranks(comms: list, start, opts: SweepOptions, steps: list) -> list[list[dict]]:
    """The sweep of the ranks in ``comms``, driven by this thread: one rank (a thread or
    process per rank, ``sweep_worker``) or every rank of the world (``init_all``, as
    nccl-tests' ``-g``). ``start`` starts them. Each size (with the garbage collector
    paused, ``gcpause``): ``warmup`` runs waited one by one, then ``iters`` runs submitted
    back to back (every rank's k-th before any rank's (k+1)-th) and waited together; the
    daemon keeps up to RUNS_IN_FLIGHT of them on the device (the launch baseline one).
    Every buffer is made and filled before the first run and the results are read after
    the last: a copy made while a peer's kernel waits for this rank can wait behind it,
    which the launch-per-collective baseline, like NCCL, does not survive (on the H200 a
    rank blocked between sizes, a peer's kernel waiting for it)."""
    for comm in comms:
        for i, (_, count) in enumerate(steps):
            comm.prepare(i, opts.coll, count=count, dtype=opts.dtype, op=opts.op,
                         root=opts.root)
    start()
    buffers = [[_buffers(comm, opts, count) for _, count in steps] for comm in comms]
    bar = None
    if opts.progress and comms[0].rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=len(steps), desc=f"bench {opts.coll}", unit="size", file=sys.stderr)
    seconds, costs = [], []
    with gc_paused():
        for i in range(len(steps)):
            for _ in range(opts.warmup):
                _wait([comm.run(i, *mine[i]) for comm, mine in zip(comms, buffers)])
            before = [comm.stats() for comm in comms]
            t0 = time.perf_counter()
            _wait([comm.run(i, *mine[i]) for _ in range(opts.iters)
                   for comm, mine in zip(comms, buffers)])
            seconds.append((time.perf_counter() - t0) / max(1, opts.iters))
            costs.append([{k: after[k] - was[k] for k in ("preemptions", "launches")}
                          for was, after in zip(before, (comm.stats() for comm in comms))])
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return [[dict(size=nbytes, count=count, seconds=seconds[i],
                  wrong=_wrong(comm, opts, count, mine[i]), **costs[i][r])
             for i, (nbytes, count) in enumerate(steps)]
            for r, (comm, mine) in enumerate(zip(comms, buffers))]


def sweep_worker(comm, opts: SweepOptions, steps: list) -> list[dict]:
    """One rank's sweep (``pydfccl.launch``: a thread or process per rank)."""
    return sweep_ranks([comm], comm.start, opts, steps)[0]


def _buffers(comm, opts: SweepOptions, count: int) -> tuple:
    send_elems, recv_elems = buffer_elems(opts.coll, count, comm.nranks)
    send = comm.empty(send_elems, opts.dtype)
    send[...] = sweep_input(comm.rank, send_elems, opts.dtype)
    return send, comm.empty(recv_elems, opts.dtype)


def _wait(futures: list) -> None:
    for f in futures:
        f.result(timeout=600)


def _wrong(comm, opts: SweepOptions, count: int, buffers: tuple) -> int:
    """Wrong elements of the last run's output (-1: not checked)."""
    if not opts.check:
        return -1
    send_elems, _ = buffer_elems(opts.coll, count, comm.nranks)
    rank = 0 if opts.coll in SAME_FOR_EVERY_RANK else comm.rank
    want = expected_output(opts.coll, comm.nranks, send_elems, opts.dtype, opts.op, opts.root, rank)
    got = np.asarray(buffers[1])
    return 0 if want is None else int(np.count_nonzero(got[:want.size] != want))


def one_thread_sweep(opts: SweepOptions, steps: list, **options) -> list[list[dict]]:
    """Every rank driven by this thread (GPU only: ``init_all``)."""
    comms = init_all(opts.nranks, **options, **opts.world)
    try:
        return sweep_ranks(comms, lambda: start_all(comms), opts, steps)
    finally:
        close_all(comms)


def run_sweep(opts: SweepOptions, mode: str = "daemon", backend=None,
              driver: str = "threads") -> list[dict]:
    """The sweep in one mode (``daemon`` or a key of BASELINES); one row per size with the
    slowest rank's time and the wrong elements summed over ranks. ``driver``: ``threads``
    (``pydfccl.launch``, a thread or process per rank) or ``one`` (this thread drives every
    rank; GPU only)."""
    steps = sizes(opts)
    options = BASELINES.get(mode) or dict(policy=opts.policy)   # the object, as it came
    if mode in ("NCCL", "gloo"):       # torch.distributed's backend of that name
        from ..torch.nccl_bench import run_torch_sweep
        per_rank = run_torch_sweep(opts, steps, backend=mode.lower())
    elif driver == "one":
        per_rank = one_thread_sweep(opts, steps, **options)
    else:
        per_rank = launch(sweep_worker, opts.nranks, backend=backend, args=(opts, steps),
                          **options, **opts.world)
    factor = bus_factor(opts.coll, opts.nranks)
    rows = []
    for i, (nbytes, count) in enumerate(steps):
        seconds = max(r[i]["seconds"] for r in per_rank)
        wrongs = [r[i]["wrong"] for r in per_rank]
        algbw = nbytes / seconds / 1e9
        rows.append(dict(mode=mode, size=nbytes, count=count, type=opts.dtype, redop=opts.op,
                         root=opts.root if opts.coll in ("broadcast", "reduce") else -1,
                         time_us=seconds * 1e6, algbw=algbw, busbw=algbw * factor,
                         wrong=sum(wrongs) if min(wrongs) >= 0 else -1,
                         **{k: _summed(per_rank, i, k) for k in ("preemptions", "launches")}))
    return rows


def _summed(per_rank: list, i: int, key: str) -> int:
    """A count of size ``i``'s timed runs summed over the ranks; -1 where a mode has none
    (NCCL itself)."""
    values = [r[i].get(key, -1) for r in per_rank]
    return sum(values) if min(values) >= 0 else -1


def run_cycles(opts: SweepOptions, modes: list, cycles: int = 1, backend: str | None = None,
               driver: str = "threads", on_rows=None) -> dict:
    """The sweep in every mode, ``cycles`` times with the modes taking turns, so that a
    drift of the host or the device over a long run reaches them alike: {mode: [rows of
    each cycle]}. ``on_rows(cycle, mode, rows)`` is called as each sweep ends (a long run
    shows its figures as it goes)."""
    out: dict = {mode: [] for mode in modes}
    for cycle in range(cycles):
        for mode in modes:
            rows = run_sweep(opts, mode, backend, driver)
            out[mode].append(rows)
            if on_rows is not None:
                on_rows(cycle, mode, rows)
    return out
