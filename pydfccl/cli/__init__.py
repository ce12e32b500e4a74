"""``python -m pydfccl SUBCOMMAND``: each subcommand is a library function plus a thin parser."""

from __future__ import annotations

import importlib
import sys

__all__ = ["SUBCOMMANDS", "main"]

# name -> (module with main(argv) -> int, one-line help)
SUBCOMMANDS = {
    "demo": ("pydfccl.cli.demo", "the chaos test: disordered collectives, every result verified"),
    "bench": ("pydfccl.cli.sweep", "nccl-tests-style size sweep against baselines; "
                               "'bench latency' for small-message latency"),
    "risk": ("pydfccl.sched.risk", "the paper's deadlock-risk study (no GPU needed)"),
    "soak": ("pydfccl.cli.soak", "many random schedules end to end, every output verified"),
    "doctor": ("pydfccl.cli.doctor", "what this machine offers pydfccl (versions, GPUs, MPS, "
                                 "launchers, kernel cache)"),
}


def _usage() -> str:
    lines = ["usage: python -m pydfccl {" + ",".join(SUBCOMMANDS) + "} [--help] ...", ""]
    lines += [f"  {name:<6} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"unknown subcommand {name!r}\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)
