"""The soak: many random schedules run end to end on the engine, every output checked.

Each schedule draws, from a generator seeded by (seed, schedule index), a rank count, a few
collectives (every kind, op and dtype the engine implements; counts of 1, around a slot's
size, and anything up to ``max_count``), how many times each runs, every rank's own
submission order and priorities, and where each rank calls a device-wide synchronize
between its submissions. Every rank checks every output against numpy
(:mod:`pydfccl.protocol.reference`). The summary counts what was verified, wrong and lost, and shows
this process's threads and memory at the start and end, so that a long run shows they stay
flat. ``python -m pydfccl soak`` exits 0 only when nothing was wrong or lost.
"""

from __future__ import annotations

import argparse
import sys

from ..host.world_config import WorldConfig, on_gpu
from .exits import UsageError
from .options import (add_policy_options, check_backend, chosen_policy, policy_label,
                      policy_name, where)
from .soak_report import SoakReport, summarize
from .soak_resources import grown_types, resource_sample
from .soak_run import run_soak, soak_worker
from .soak_schedules import Collective, Schedule, SoakOptions, draw_schedule, soak_input

__all__ = ["SoakOptions", "Collective", "Schedule", "SoakReport", "draw_schedule",
           "soak_input", "soak_worker", "run_soak", "grown_types", "resource_sample",
           "build_parser", "main"]

EXIT_OK, EXIT_FAILED = 0, 1


def build_parser() -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog="python -m pydfccl soak", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-s", "--schedules", type=int, default=None,
                   help=f"schedules to run (if omitted: {200 if gpu else 10}, or no limit "
                        "with --seconds)")
    p.add_argument("--seconds", type=float, default=None,
                   help="start no new schedule after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-ranks", type=int, default=4 if gpu else 3,
                   help="ranks per schedule: 2 up to this")
    p.add_argument("--max-count", type=int, default=100_000 if gpu else 200,
                   help="largest count of a collective (NCCL's meaning)")
    p.add_argument("--max-colls", type=int, default=8 if gpu else 4,
                   help="collectives per schedule: 1 up to this")
    add_policy_options(p)
    p.add_argument("--only", type=int, metavar="INDEX",
                   help="run only schedule INDEX of this seed (to reproduce a failure)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _options(args: argparse.Namespace) -> tuple[SoakOptions, dict]:
    """The options, and --param's overrides (for the headline and the rerun line)."""
    policy, overrides = chosen_policy(args)
    max_colls = WorldConfig(2, simulator=not on_gpu()).max_colls
    checks = [(args.max_ranks >= 2, "--max-ranks must be at least 2"),
              (args.max_count >= 1, "--max-count must be at least 1"),
              (1 <= args.max_colls <= max_colls, f"--max-colls must be in 1..{max_colls}"),
              (args.schedules is None or args.schedules >= 1, "--schedules must be at least 1"),
              (args.seconds is None or args.seconds > 0, "--seconds must be more than 0"),
              (args.only is None or args.only >= 0, "--only must be a schedule index (>= 0)")]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    check_backend(None)     # the soak launches on the default one (PYDFCCL_BACKEND)
    schedules = args.schedules
    if schedules is None and args.seconds is None:
        schedules = 200 if on_gpu() else 10
    return SoakOptions(schedules=schedules, seconds=args.seconds, seed=args.seed,
                       max_ranks=args.max_ranks, max_count=args.max_count,
                       max_colls=args.max_colls, policy=policy,
                       progress=not args.no_progress, only=args.only), overrides


def _extent(opts: SoakOptions) -> str:
    if opts.only is not None:
        return f"schedule {opts.only}"
    limits = []
    if opts.schedules is not None:
        limits.append(f"{opts.schedules} schedules")
    if opts.seconds is not None:
        limits.append(f"{opts.seconds:g} s")
    return " or ".join(limits)


def rerun_line(opts: SoakOptions, overrides: dict, index: int) -> str:
    """The command that runs schedule ``index`` of this soak alone."""
    params = "".join(f" --param {k}={v}" for k, v in overrides.items())
    return (f"python -m pydfccl soak --seed {opts.seed} --max-ranks {opts.max_ranks} "
            f"--max-count {opts.max_count} --max-colls {opts.max_colls} --policy "
            f"{policy_name(opts.policy)}{params} --only {index}")


def main(argv: list[str]) -> int:
    opts, overrides = _options(build_parser().parse_args(argv))
    print(f"pydfccl soak on the {where()}: {_extent(opts)}, 2..{opts.max_ranks} ranks, "
          f"1..{opts.max_colls} collectives of 1..{opts.max_count} elements, seed {opts.seed}, "
          f"policy {policy_label(opts.policy, overrides)}", flush=True)
    report = run_soak(opts)
    print(summarize(report, opts, where()))
    for line in report.wrong[:10]:
        print(f"wrong: {line}", file=sys.stderr)
    for text in report.failures:
        print(f"failed: {text}", file=sys.stderr)
    verdict = report.verdict()
    if verdict is None:
        print("OK: every output verified, nothing lost")
        return EXIT_OK
    print(f"FAILED: {verdict}", file=sys.stderr)
    for index in report.bad_schedules[:3]:
        print(f"rerun schedule {index} alone: {rerun_line(opts, overrides, index)}",
              file=sys.stderr)
    return EXIT_FAILED
