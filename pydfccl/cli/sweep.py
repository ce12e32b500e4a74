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
import sys
import traceback

from ..bootstrap.launch import BACKENDS, default_backend
from ..host.world_config import machine_sizes, on_gpu
from ..protocol.one_shot import one_shot_limit
from ..protocol.codes import COLLECTIVE_KINDS, DTYPES, OPS
from .exits import UsageError
from .options import (add_policy_options, check_backend, check_world_sizes, chosen_policy,
                      policy_label, where)
from .sweep_hbm import hbm_report
from .sweep_measure import BASELINE_CHOICES, all_ranks_on_this_gpu, bench_modes, run_cycles, \
    run_sweep
from .sweep_output import combine_cycles, cycle_line, mode_table, plot, write_csv, write_json
from .sweep_spec import SweepOptions, bus_factor, sizes

__all__ = ["SweepOptions", "bus_factor", "sizes", "run_sweep", "run_cycles", "build_parser",
           "main"]

EXIT_WRONG = 1      # as nccl-tests: a sweep that read wrong results fails


def build_parser() -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog="python -m pydfccl bench",
                                description=__doc__.split("\n")[0],
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
    p.add_argument("--baseline", default="launch", choices=list(BASELINE_CHOICES),
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


def _options(args: argparse.Namespace) -> tuple[SweepOptions, dict]:
    """The options, and --param's overrides (for the headline)."""
    policy, overrides = chosen_policy(args)
    world = {k: v for k, v in (("nblocks", args.nblocks), ("nthreads", args.nthreads),
                               ("nslots", args.nslots), ("slot_bytes", args.slot_bytes))
             if v is not None}
    opts = SweepOptions(coll=args.coll, nranks=args.nranks, minbytes=args.minbytes,
                        maxbytes=args.maxbytes, stepfactor=args.stepfactor, iters=args.iters,
                        warmup=args.warmup, check=bool(args.check), dtype=args.datatype,
                        op=args.op, root=args.root, policy=policy,
                        progress=not args.no_progress, world=world)
    if args.cycles < 1:
        raise UsageError(f"-N/--cycles must be at least 1, got {args.cycles}")
    if not 0 <= opts.root < opts.nranks:
        raise UsageError(f"root {opts.root} out of range for {opts.nranks} ranks")
    check_world_sizes(opts.nranks, **world)
    check_backend(args.backend)
    return opts, overrides


def _driver(args: argparse.Namespace) -> str:
    one_possible = all_ranks_on_this_gpu(args.backend)
    driver = args.driver or ("one" if one_possible else "threads")
    if driver == "one" and not one_possible:
        raise UsageError("--driver one needs a GPU and the threads backend")
    return driver


def _headline(opts: SweepOptions, overrides: dict, backend: str | None, driver: str) -> str:
    drivers = {"one": "one thread driving every rank",
               "threads": f"a thread or process per rank ({backend or default_backend()} "
                          "backend)"}
    lines = [f"# pydfccl bench on the {where()}: {opts.coll}, {opts.nranks} ranks, "
             f"{drivers[driver]}, policy {policy_label(opts.policy, overrides)}, "
             f"{opts.iters} runs per size after {opts.warmup} warm-up"
             + "".join(f", {k} {v}" for k, v in opts.world.items())]
    if opts.coll == "all_reduce":
        _, slot_bytes = machine_sizes(opts.nranks, slot_bytes=opts.world.get("slot_bytes"))
        most = one_shot_limit(opts.nranks, slot_bytes)
        lines.append(f"# all_reduce up to {most} bytes runs one-shot, larger in the ring "
                     "(PYDFCCL_ONE_SHOT_BYTES; docs/design.md)" if most else
                     "# all_reduce runs in the ring at every size")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "latency":          # the small-message latency benchmark
        from .bench import main as latency_main
        return latency_main(argv[1:])
    if argv and argv[0] == "registration":     # prepare + start of many collectives
        from .registration_bench import main as registration_main
        return registration_main(argv[1:])
    if argv and argv[0] == "startup":          # fresh processes to the first result
        from .startup import main as startup_main
        return startup_main(argv[1:])
    from ..bootstrap.mpi import in_mpi_job
    if (argv and argv[0] == "net") or in_mpi_job():   # a rank of an mpiexec job
        from .bench_net import main as net_main
        return net_main(argv[1:] if argv and argv[0] == "net" else argv)
    args = build_parser().parse_args(argv)
    opts, overrides = _options(args)
    driver = _driver(args)
    print(_headline(opts, overrides, args.backend, driver))
    modes, torch_skipped = bench_modes(args.baseline, args.torch_backend, opts.coll,
                                       opts.nranks)
    if torch_skipped:
        print(f"# torch baseline skipped: {torch_skipped}")
    first: dict = {}        # each mode's first rows; the daemon's are the tables' base

    def show(cycle: int, mode: str, rows: list) -> None:
        first.setdefault(mode, rows)
        if args.cycles > 1:
            print(cycle_line(cycle, args.cycles, mode, rows), flush=True)
        else:       # each table as soon as it is measured: a long sweep shows progress
            print(mode_table(rows, first["daemon"]), flush=True)

    cycles = run_cycles(opts, modes, args.cycles, args.backend, driver, on_rows=show)
    results = combine_cycles(cycles)
    if args.cycles > 1:
        print(f"# the median of {args.cycles} cycles at each size (#wrong: all cycles)")
        for mode in modes:
            print(mode_table(results[mode], results["daemon"]), flush=True)
    hbm_failed = False
    if not args.no_hbm:
        try:
            print(hbm_report(results, opts, args.backend), flush=True)
        except Exception:    # an extra table: the rows are still written, and the exit fails
            traceback.print_exc()
            hbm_failed = True
    all_rows = [r for rows in results.values() for r in rows]
    if args.csv:
        write_csv(all_rows, args.csv)
    if args.json:
        write_json(opts, all_rows, args.json)
    if args.plot:
        plot(results, args.plot, f"pydfccl {opts.coll}, {opts.nranks} ranks ({where()})")
    wrong = sum(max(0, r["wrong"]) for r in all_rows)
    if wrong:
        print(f"bench: {wrong} wrong elements", file=sys.stderr)
    if hbm_failed:
        print("bench: the HBM efficiency table failed (above)", file=sys.stderr)
    return EXIT_WRONG if wrong or hbm_failed else 0
