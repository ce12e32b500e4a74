"""``python -m pydfccl check-policy NAME``: is a policy ready for the device, in seconds?

First its functions are compiled with Numba on the CPU with the argument types the
daemon passes (:mod:`pydfccl.kernels.policy_types`): what cannot compile for the device is
refused with its line. Then a bounded random trial in the model (:mod:`pydfccl.sched.trial`)
checks the property tests' oracle; a failure is written as a counterexample file for
``python -m pydfccl replay``. One line says the verdict; exit 0 when both pass, 1 when
either fails, 2 on a bad argument.
"""

from __future__ import annotations

import argparse
import time

from ..sched.choice import parse_params
from .exits import UsageError

__all__ = ["build_parser", "main"]

EXIT_OK, EXIT_FAILED = 0, 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl check-policy",
                                description=__doc__.split("\n")[0].split(": ", 1)[1])
    p.add_argument("policy", metavar="POLICY",
                   help="a registered name, an installed plugin's, or package.module:name")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter (repeatable), as --param of the other commands")
    p.add_argument("--examples", type=int, default=300,
                   help="random schedules the model runs at most")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="start no new schedule after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--counterexample", metavar="FILE", default="counterexample.json",
                   help="where a failing schedule is written")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from ..sched.policies import get_policy

    try:
        policy = get_policy(args.policy).with_params(**parse_params(args.param))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.examples < 1 or args.seconds <= 0:
        raise UsageError("--examples must be at least 1 and --seconds more than 0")
    head = f"check-policy {args.policy}"
    started = time.perf_counter()

    from ..kernels.policy_types import PolicyTypeError, check_policy_types

    try:
        check_policy_types(policy)
    except PolicyTypeError as exc:
        print(f"{head}: FAILED for the device: {exc}")
        return EXIT_FAILED
    typed = time.perf_counter() - started

    from ..sched.trial import trial

    report = trial(policy, args.examples, args.seconds, args.seed)
    if report.failure is not None:
        failure = report.failure
        if ":" in args.policy or failure.policy != args.policy:
            failure = type(failure)(failure.schedule, args.policy, failure.params,
                                    failure.options, failure.seed, failure.model)
        failure.save(args.counterexample)
        print(f"{head}: FAILED in the model: example {report.examples}: {failure.model}; "
              f"written to {args.counterexample} (python -m pydfccl replay "
              f"{args.counterexample})")
        return EXIT_FAILED
    kind = ("complete with exact sums" if policy.preemptive else
            "in one order without late syncs complete")
    print(f"{head}: OK: its functions compile with the daemon's types ({typed:.1f} s); "
          f"{report.examples} random schedules {kind} in the model ({report.seconds:.1f} s)")
    return EXIT_OK
