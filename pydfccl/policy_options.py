"""The command line's ``--policy NAME`` and ``--param NAME=VALUE``, shared by ``bench``,
``bench latency`` and ``demo`` so that a policy experiment reads the same in each; and
``PYDFCCL_POLICY`` / ``PYDFCCL_PARAMS``, the same choice for programs that make their
communicators elsewhere (``torch.distributed``'s dfccl backend)."""
from __future__ import annotations

import argparse
import os

from .sched.policies import Policy, get_policy, policy_names

__all__ = ["add_policy_options", "parse_params", "chosen_policy", "policy_from_env"]


def add_policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="dfccl", choices=policy_names())
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter of the daemon's policy (repeatable; GPU times "
                        "in ns), e.g. --param HEAD_BASE=20000; baselines keep theirs")


def parse_params(items: list[str]) -> dict:
    """``["BASE=100000", ...]`` as {name: int}; ValueError names a malformed item."""
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{item!r}: expected NAME=INTEGER")
        params[name.strip()] = int(value)
    return params


def chosen_policy(args: argparse.Namespace) -> tuple[Policy, dict]:
    """The policy ``--policy`` names with ``--param``'s overrides, and the overrides
    ({name: int}); ValueError names a malformed item or a parameter the policy lacks."""
    params = parse_params(args.param)
    return get_policy(args.policy).with_params(**params), params


def policy_from_env(default: str = "dfccl") -> Policy:
    """The policy ``PYDFCCL_POLICY`` names (``default`` when unset) with the overrides of
    ``PYDFCCL_PARAMS`` (``NAME=VALUE`` items separated by commas, as ``--param`` takes
    them); ValueError names what is wrong."""
    name = os.environ.get("PYDFCCL_POLICY", "").strip() or default
    items = [i for i in os.environ.get("PYDFCCL_PARAMS", "").split(",") if i.strip()]
    try:
        return get_policy(name).with_params(**parse_params(items))
    except ValueError as exc:
        raise ValueError(f"PYDFCCL_POLICY={name!r} PYDFCCL_PARAMS="
                         f"{os.environ.get('PYDFCCL_PARAMS', '')!r}: {exc}") from None
