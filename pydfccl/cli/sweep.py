"""``python -m pydfccl bench``: a size sweep in nccl-tests' form.

For each size from ``-b`` to ``-e`` (times ``-f``), every rank submits ``-n`` runs of one
collective back to back (after ``-w`` warm-up runs) and waits for them; the time of a run is
the slowest rank's wall time divided by ``-n``. On a GPU with the ranks as threads, one
thread drives every rank (``--driver one``, as nccl-tests' ``-g``): rank threads would hand
the GIL to one another between submissions. Columns and bus-bandwidth factors follow
nccl-tests (``doc/PERFORMANCE.md`` there): algbw = size / time, busbw = algbw x factor, with
factor 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, and 1
for broadcast and reduce. ``size`` is the bytes of the larger of a rank's two buffers, as
nccl-tests prints it; ``count`` is the elements per rank as ``prepare`` takes it. Two
columns follow nccl-tests' own: the preemptions and the kernel launches that a size's timed
runs cost, summed over the ranks (what preemption costs is what its users ask first).

Baselines are measured in the same run, with the same sizes and ranks: ``launch`` (the same
kernels, a kernel launch per collective, no daemon), ``nccl`` (the daemon under the ``nccl``
policy: no preemption) and ``torch`` (NCCL itself through ``torch.distributed``, a process
per GPU: only where there is a GPU per rank; ``pydfccl.torch.nccl_bench``). Each row of a
baseline shows its time over the daemon's.

On a GPU with every rank on it (the threads backend), a second table, "HBM efficiency", puts
each row of pydfccl's own kernels (the daemon, ``launch``, ``nccl``) against a
device-to-device copy of the same size timed in this run (``pydfccl.cli.hbm``): the bytes all
ranks read and write in device memory per run, walked from the step plan (all_reduce:
(6n-4) x size), over the time, as a share of the copy's bytes read plus written. The rows
written by ``--csv``/``--json`` gain ``hbm_bytes``, ``hbm_gbs``, ``copy_gbs`` and
``hbm_pct_of_copy``. ``--no-hbm`` leaves it out; under the simulator one line says it needs a
GPU.
This is a benchmark: with ``-c`` it counts wrong elements (#wrong) and carries on to the
end, then exits with status 1 if any run was wrong, as nccl-tests does. ``-N`` repeats the
whole sweep with the modes taking turns and reports each size's median cycle, and for a
baseline also the median of its ratios to the daemon within a cycle (``x paired``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

import numpy as np

from .. import platform
from ..protocol.codes import COLLECTIVE_KINDS, DTYPES, OPS, storage_dtype
from ..host.gcpause import gc_paused
from ..bootstrap.group import close_all, init_all, start_all
from ..kernels.plans import one_shot_limit
from ..bootstrap.launch import BACKENDS, default_backend, launch
from ..protocol.reference import buffer_elems
from .options import add_policy_options, chosen_policy
from ..sched.policies import get_policy
from ..host.world import machine_sizes
from .sweep_spec import (SAME_FOR_EVERY_RANK, SweepOptions, bus_factor, expected_output, sizes,
                         sweep_input)

__all__ = ["SweepOptions", "bus_factor", "sizes", "sweep_worker", "run_sweep", "add_hbm",
           "format_hbm_table", "hbm_report", "main"]

BASELINES = {"launch": dict(policy="nccl", persistent=False), "nccl": dict(policy="nccl")}
HBM_MODES = ("daemon", "launch", "nccl")    # pydfccl's kernels: the step plan hbm.py walks


def sweep_ranks(comms: list, start, opts: SweepOptions, steps: list) -> list[list[dict]]:
    """The sweep of the ranks in ``comms``, driven by this thread: one rank (a thread or
    process per rank, ``sweep_worker``) or every rank of the world (``init_all``, as
    nccl-tests' ``-g``). ``start`` starts them. Each size (with the garbage collector
    paused, ``gcpause``): ``warmup`` runs waited one by one, then ``iters`` runs submitted
    back to back (every rank's k-th before any rank's (k+1)-th) and waited together; the
    daemon keeps up to RUNS_IN_FLIGHT of them on the device (the launch baseline one).
    Every buffer is made and filled before the first run and the results are read after
    the last: a copy made while a peer's kernel waits for this rank can wait behind it,
    which the launch-per-collective baseline, like NCCL, does not survive (H200,
    2026-11-30 00:39: a rank blocked between sizes, a peer's kernel waiting for it)."""
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
            if bar:
                bar.update(1)
    if bar:
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
    platform.copy_in(send, sweep_input(comm.rank, send_elems, opts.dtype))
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
    got = platform.to_numpy(buffers[1], opts.dtype)
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
    options = BASELINES.get(mode) or dict(
        policy=get_policy(opts.policy).with_params(**opts.params))
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


def format_table(rows: list[dict], base: dict | None) -> str:
    """nccl-tests' columns, then what the timed runs cost in preemptions and kernel
    launches (all ranks; N/A for NCCL itself), the fastest and slowest cycle's times when
    the sweep ran several (``-N``), and the time over the daemon's for a baseline (with
    several cycles also ``x paired``: see ``paired_ratios``)."""
    spread = "time_min_us" in rows[0]
    paired = "x_daemon_paired" in rows[0]
    head = (f"{'mode':>8} {'size(B)':>12} {'count':>10} {'type':>8} {'redop':>6} {'root':>5} "
            f"{'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7} "
            f"{'preempt':>8} {'launches':>8}")
    if spread:
        head += f" {'min(us)':>10} {'max(us)':>10}"
    if base:
        head += f" {'x daemon':>9}"
    if paired:
        head += f" {'x paired':>9}"
    lines = [head]
    for r in rows:
        line = (f"{r['mode']:>8} {r['size']:>12} {r['count']:>10} {r['type']:>8} "
                f"{r['redop']:>6} {r['root']:>5} {r['time_us']:>10.1f} {r['algbw']:>12.3f} "
                f"{r['busbw']:>12.3f} {r['wrong'] if r['wrong'] >= 0 else 'N/A':>7} "
                f"{_count(r['preemptions']):>8} {_count(r['launches']):>8}")
        if spread:
            line += f" {r['time_min_us']:>10.1f} {r['time_max_us']:>10.1f}"
        if base:
            line += f" {r['time_us'] / base[r['size']]:>9.2f}"
        if paired:
            line += f" {r['x_daemon_paired']:>9.2f}"
        lines.append(line)
    return "\n".join(lines)


def _count(n: int) -> str:
    return str(n) if n >= 0 else "N/A"


def add_hbm(results: dict, opts: SweepOptions, copy_gbs: dict) -> list[dict]:
    """Add ``hbm_bytes`` (read plus written by all ranks per run), ``hbm_gbs``, ``copy_gbs``
    (``copy_gbs[size]``: the copy of the row's size) and ``hbm_pct_of_copy`` to each row of
    the modes in HBM_MODES; return those rows."""
    from .hbm import hbm_bytes
    from ..host.world import WorldConfig

    cfg = WorldConfig(opts.nranks, **opts.world)      # the sizes launch gives the ranks
    itemsize = storage_dtype(opts.dtype).itemsize
    counted, out = {}, []
    for mode in HBM_MODES:
        for r in results.get(mode, []):
            if r["count"] not in counted:
                counted[r["count"]] = hbm_bytes(opts.coll, opts.nranks, r["count"], itemsize,
                                                root=opts.root, nblocks=cfg.nblocks,
                                                slot_bytes=cfg.slot_bytes)
            nbytes = counted[r["count"]]
            gbs = nbytes / (r["time_us"] * 1e-6) / 1e9
            copy = copy_gbs[r["size"]]
            r.update(hbm_bytes=nbytes, hbm_gbs=gbs, copy_gbs=copy,
                     hbm_pct_of_copy=100 * gbs / copy)
            out.append(r)
    return out


def format_hbm_table(rows: list[dict]) -> str:
    head = (f"{'mode':>8} {'size(B)':>12} {'time(us)':>10} {'HBM bytes':>14} "
            f"{'HBM GB/s':>10} {'copy GB/s':>10} {'% of copy':>10}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['mode']:>8} {r['size']:>12} {r['time_us']:>10.1f} "
                     f"{r['hbm_bytes']:>14} {r['hbm_gbs']:>10.1f} {r['copy_gbs']:>10.1f} "
                     f"{r['hbm_pct_of_copy']:>10.1f}")
    return "\n".join(lines)


def all_ranks_on_this_gpu(backend: str | None) -> bool:
    """A GPU, and the ranks as threads on it: what the one-thread driver and the HBM table
    need."""
    return platform.gpu_available() and (backend or default_backend()) == "threads"


def hbm_report(results: dict, opts: SweepOptions, backend: str | None) -> str:
    """The "HBM efficiency" table (adding its values to the rows), or the line that says
    why there is none: it needs a GPU, and every rank on it (the threads backend)."""
    if not platform.gpu_available():
        return "# HBM efficiency: needs a GPU (not measured on the CUDA simulator)"
    if not all_ranks_on_this_gpu(backend):
        return (f"# HBM efficiency: only with every rank on this one GPU (the threads "
                f"backend), not with the {backend or default_backend()} backend")
    if not any(results.get(mode) for mode in HBM_MODES):
        return "# HBM efficiency: no row of pydfccl's kernels to count"
    from .hbm import copy_bandwidths

    copy = copy_bandwidths({r["size"] for m in HBM_MODES for r in results.get(m, [])})
    rows = add_hbm(results, opts, copy)
    lines = [f"# HBM efficiency ({opts.coll}, {opts.nranks} ranks on this GPU): HBM bytes = "
             "read plus written in device memory by all ranks per run, as the step plan "
             "moves them (pydfccl.cli.hbm); copy = cuMemcpyDtoDAsync of the same size in this run, "
             "read plus written"]
    try:
        l2 = platform.device_attribute("L2_CACHE_SIZE")
        lines.append(f"# sizes near or under the L2 cache ({l2 / 2**20:.0f} MiB) need not "
                     "reach HBM")
    except Exception:     # only a note: the table stands without it
        pass
    return "\n".join(lines + [format_hbm_table(rows)])


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, rows in results.items():
        ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    gpu = platform.gpu_available()
    p = argparse.ArgumentParser(prog="python -m pydfccl bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--coll", default="all_reduce", choices=COLLECTIVE_KINDS)
    p.add_argument("--nranks", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=int, default=8)
    p.add_argument("-e", "--maxbytes", type=int, default=(32 << 20) if gpu else 4096)
    p.add_argument("-f", "--stepfactor", type=int, default=2)
    p.add_argument("-n", "--iters", type=int, default=20 if gpu else 3)
    p.add_argument("-w", "--warmup", type=int, default=5 if gpu else 1)
    p.add_argument("-N", "--cycles", type=int, default=1,
                   help="run the whole sweep this many times, the modes taking turns, and "
                        "report each size's median cycle (with the fastest and slowest) and a "
                        "baseline's median ratio within a cycle (x paired)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1),
                   help="count wrong elements (#wrong)")
    p.add_argument("-d", "--datatype", default="float32", choices=list(DTYPES))
    p.add_argument("-o", "--op", default="sum", choices=list(OPS))
    p.add_argument("-r", "--root", type=int, default=0)
    add_policy_options(p)
    p.add_argument("--baseline", default="launch",
                   choices=("none", "launch", "nccl", "both", "torch", "all"),
                   help="launch: a kernel launch per collective; nccl: the no-preemption "
                        "policy; both: those two; torch: NCCL itself through torch.distributed "
                        "(a GPU per rank); all: the three")
    p.add_argument("--torch-backend", default="nccl", choices=("nccl", "gloo"),
                   help="the torch baseline's backend (gloo: CPU tensors, to check the "
                        "baseline's code where NCCL cannot run)")
    p.add_argument("--backend", choices=BACKENDS, default=None)
    for name, what in (("nblocks", "daemon blocks (channels) per rank"),
                       ("nthreads", "threads per block"), ("nslots", "slots per connector"),
                       ("slot-bytes", "bytes per slot")):
        p.add_argument(f"--{name}", type=int, default=None,
                       help=f"{what} (WorldConfig; default: the GPU's or the simulator's)")
    p.add_argument("--csv", metavar="FILE", help="write every row as CSV")
    p.add_argument("--json", metavar="FILE", help="write every row as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw busbw against size (PNG)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--driver", choices=("one", "threads"), default=None,
                   help="one: this thread drives every rank (pydfccl.init_all, as nccl-tests' "
                        "-g; GPU and threads backend only); threads: a thread or process per "
                        "rank (pydfccl.launch); default: one where it can run")
    p.add_argument("--no-hbm", action="store_true",
                   help="leave out the HBM efficiency table (GPU, threads backend: the bytes "
                        "the algorithm reads and writes against a copy measured in this run)")
    return p


def median_rows(cycles: list[list[dict]]) -> list[dict]:
    """One mode's rows from several cycles of the sweep: at each size the row of the cycle
    with the median time (the lower one of an even count), its fastest and slowest times
    beside it, and #wrong summed over every cycle."""
    if len(cycles) == 1:
        return cycles[0]
    rows = []
    for same_size in zip(*cycles):
        ranked = sorted(same_size, key=lambda r: r["time_us"])
        wrongs = [r["wrong"] for r in same_size]
        rows.append(dict(ranked[(len(ranked) - 1) // 2], cycles=len(ranked),
                         time_min_us=ranked[0]["time_us"], time_max_us=ranked[-1]["time_us"],
                         wrong=sum(wrongs) if min(wrongs) >= 0 else -1))
    return rows


def paired_ratios(rows: list[dict], cycles: list[list[dict]], daemon: list[list[dict]]):
    """Add to a baseline's median rows ``x_daemon_paired``: at each size the median over
    the cycles of its time over the daemon's in the same cycle. The two runs of a pair are
    seconds apart, where the cycles' medians may be minutes apart, so a drift of the host
    between cycles moves this ratio less than it moves ``x daemon``."""
    for i, row in enumerate(rows):
        row["x_daemon_paired"] = float(np.median(
            [mine[i]["time_us"] / theirs[i]["time_us"] for mine, theirs in zip(cycles, daemon)]))


def print_table(rows: list[dict], daemon_rows: list[dict]) -> None:
    """A mode's table (with its time over the daemon's, unless it is the daemon's) and its
    average bus bandwidth."""
    base = None if rows is daemon_rows else {r["size"]: r["time_us"] for r in daemon_rows}
    print(format_table(rows, base), flush=True)
    print(f"# {rows[0]['mode']}: Avg bus bandwidth    : "
          f"{np.mean([r['busbw'] for r in rows]):.3f} GB/s", flush=True)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "latency":          # the small-message latency benchmark
        from .bench import main as latency_main
        return latency_main(argv[1:])
    args = build_parser().parse_args(argv)
    _, params = chosen_policy(args)
    opts = SweepOptions(coll=args.coll, nranks=args.nranks, minbytes=args.minbytes,
                        maxbytes=args.maxbytes, stepfactor=args.stepfactor, iters=args.iters,
                        warmup=args.warmup, check=bool(args.check), dtype=args.datatype,
                        op=args.op, root=args.root, policy=args.policy,
                        params=params, progress=not args.no_progress,
                        world={k: v for k, v in (("nblocks", args.nblocks),
                                                 ("nthreads", args.nthreads),
                                                 ("nslots", args.nslots),
                                                 ("slot_bytes", args.slot_bytes)) if v})
    if args.cycles < 1:
        print(f"bench: -N/--cycles must be at least 1, got {args.cycles}", file=sys.stderr)
        return 2
    if not 0 <= opts.root < opts.nranks:
        print(f"bench: root {opts.root} out of range for {opts.nranks} ranks", file=sys.stderr)
        return 2
    where = "GPU" if platform.gpu_available() else "CUDA simulator (CPU)"
    one_possible = all_ranks_on_this_gpu(args.backend)
    driver = args.driver or ("one" if one_possible else "threads")
    if driver == "one" and not one_possible:
        print("bench: --driver one needs a GPU and the threads backend", file=sys.stderr)
        return 2
    drivers = {"one": "one thread driving every rank",
               "threads": f"a thread or process per rank ({args.backend or default_backend()} "
                          "backend)"}
    print(f"# pydfccl bench on the {where}: {opts.coll}, {opts.nranks} ranks, "
          f"{drivers[driver]}, policy "
          f"{opts.policy}" + "".join(f" {k}={v}" for k, v in opts.params.items())
          + f", {opts.iters} runs per size after {opts.warmup} warm-up"
          + "".join(f", {k} {v}" for k, v in opts.world.items()))
    if opts.coll == "all_reduce":
        _, slot_bytes = machine_sizes(opts.nranks, slot_bytes=opts.world.get("slot_bytes"))
        most = one_shot_limit(opts.nranks, slot_bytes)
        print(f"# all_reduce up to {most} bytes runs one-shot, larger in the ring "
              "(PYDFCCL_ONE_SHOT_BYTES; docs/design.md)" if most else
              "# all_reduce runs in the ring at every size")
    modes = ["daemon"] + {"none": [], "launch": ["launch"], "nccl": ["nccl"],
                          "both": ["launch", "nccl"], "torch": ["torch"],
                          "all": ["launch", "nccl", "torch"]}[args.baseline]
    if "torch" in modes:
        from ..torch.nccl_bench import torch_baseline_unavailable

        why = torch_baseline_unavailable(opts.coll, opts.nranks, args.torch_backend)
        modes.remove("torch")
        if why:
            print(f"# torch baseline skipped: {why}")
        else:
            modes.append("NCCL" if args.torch_backend == "nccl" else "gloo")
    cycles: dict = {mode: [] for mode in modes}
    for cycle in range(args.cycles):    # the modes take turns, so that drift on the host
        for mode in modes:              # or the device over a long run reaches them alike
            rows = run_sweep(opts, mode, args.backend, driver)
            cycles[mode].append(rows)
            if args.cycles > 1:
                # a line a cycle, with every size's time: a sweep cut off by a time limit
                # still leaves its figures
                print(f"# cycle {cycle + 1}/{args.cycles}, {mode}: Avg bus bandwidth    : "
                      f"{np.mean([r['busbw'] for r in rows]):.3f} GB/s; time(us) by size(B): "
                      + " ".join(f"{r['size']}:{r['time_us']:.1f}" for r in rows), flush=True)
            else:       # each table as soon as it is measured: a long sweep shows progress
                print_table(rows, cycles["daemon"][0])
    results = {mode: median_rows(runs) for mode, runs in cycles.items()}
    if args.cycles > 1:
        for mode in modes[1:]:
            paired_ratios(results[mode], cycles[mode], cycles["daemon"])
        print(f"# the median of {args.cycles} cycles at each size (#wrong: all cycles)")
        for mode in modes:
            print_table(results[mode], results["daemon"])
    if not args.no_hbm:
        try:
            print(hbm_report(results, opts, args.backend), flush=True)
        except Exception as exc:     # an extra table: the sweep's rows are still written
            print(f"# HBM efficiency: failed: {exc!r}", file=sys.stderr, flush=True)
    all_rows = [r for rows in results.values() for r in rows]
    if args.csv:
        import csv
        fields = list(dict.fromkeys(k for r in all_rows for k in r))  # the HBM keys: some rows
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(all_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(options=asdict(opts), rows=all_rows), f, indent=1)
    if args.plot:
        plot(results, args.plot, f"pydfccl {opts.coll}, {opts.nranks} ranks ({where})")
    wrong = sum(max(0, r["wrong"]) for r in all_rows)
    if wrong:       # as nccl-tests: a sweep that read wrong results fails
        print(f"bench: {wrong} wrong elements", file=sys.stderr)
        return 1
    return 0
