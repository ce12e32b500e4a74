"""``python -m pydfccl SUBCOMMAND``: each subcommand is a library function plus a thin parser.

:func:`main` takes the argument list, so tests call it as a user's shell does. An expected
failure (:class:`~pydfccl.cli.exits.CommandError`: a bad argument, a schedule file that
cannot be read) ends as one line on stderr and its exit status; anything else keeps its
traceback."""

from __future__ import annotations

import importlib
import sys

from .exits import EXIT_USAGE, CommandError

__all__ = ["SUBCOMMANDS", "main"]

PROG = "python -m pydfccl"

# name -> (module with main(argv) -> int, one-line help)
SUBCOMMANDS = {
    "demo": ("pydfccl.cli.demo", "the chaos test: disordered collectives, every result verified"),
    "bench": ("pydfccl.cli.sweep", "nccl-tests-style size sweep against baselines; "
                                   "'bench latency' for small-message latency, "
                                   "'bench startup' for a fresh process's start-up, "
                                   "'bench registration' for prepare + start of many, "
                                   "'bench net' (under mpiexec) across nodes"),
    "teach": ("pydfccl.cli.teach", "a deadlock a student can watch: NCCL-style, then dfccl, "
                                   "narrated, with pictures"),
    "risk": ("pydfccl.sched.risk", "the paper's deadlock-risk study (no GPU needed)"),
    "soak": ("pydfccl.cli.soak", "many random schedules end to end, every output verified"),
    "check-policy": ("pydfccl.cli.check_policy", "type-check a policy for the device, then "
                                                 "try it on random schedules in the model"),
    "replay": ("pydfccl.cli.replay_cmd", "a counterexample file in the model and on the "
                                         "engine, both verdicts side by side"),
    "doctor": ("pydfccl.cli.doctor", "what this machine offers pydfccl (versions, GPUs, MPS, "
                                     "launchers, kernel cache)"),
    "build-kernels": ("pydfccl.cli.build_kernels", "compile the daemons ahead, without a GPU, "
                                                   "into the kernel cache"),
}


def _usage() -> str:
    lines = [f"usage: {PROG} {{" + ",".join(SUBCOMMANDS) + "} [--help] ...", ""]
    lines += [f"  {name:<13} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else EXIT_USAGE
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}\n{_usage()}", file=sys.stderr)
        return EXIT_USAGE
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except CommandError as exc:
        print(f"{PROG} {name}: error: {exc}", file=sys.stderr)
        return exc.status
