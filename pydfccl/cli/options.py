"""The command line's ``--policy NAME`` and ``--param NAME=VALUE``, shared by ``bench``,
``bench latency`` and ``demo`` so that a policy experiment reads the same in each."""
from __future__ import annotations

import argparse

from ..sched.choice import parse_params
from ..sched.policies import Policy, get_policy, policy_names
from .exits import UsageError

__all__ = ["add_policy_options", "parse_params", "chosen_policy"]


def add_policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="dfccl", choices=policy_names())
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter of the daemon's policy (repeatable; GPU times "
                        "in ns), e.g. --param HEAD_BASE=20000; baselines keep theirs")


def chosen_policy(args: argparse.Namespace) -> tuple[Policy, dict]:
    """The policy ``--policy`` names with ``--param``'s overrides, and the overrides
    ({name: int}). A malformed item or a parameter the policy lacks is a UsageError."""
    try:
        params = parse_params(args.param)
        return get_policy(args.policy).with_params(**params), params
    except ValueError as exc:
        raise UsageError(f"--param {exc}") from None
