"""What several subcommands parse alike: ``--policy NAME`` (a registered name, an
installed plugin's, or ``package.module:name``: :mod:`pydfccl.sched.plugins`) with ``--param NAME=VALUE`` (so
that a policy experiment reads the same in ``bench``, ``bench latency``, ``demo`` and
``soak``), and the checks of a backend and of world sizes before anything is launched."""

from __future__ import annotations

import argparse
from dataclasses import fields

from ..bootstrap.launch import default_backend
from ..host.world_config import WorldConfig, on_gpu
from ..sched.choice import parse_params
from ..sched.plugins import spec_of
from ..sched.policies import Policy, get_policy, policy_names
from .exits import UsageError

__all__ = ["add_policy_options", "parse_params", "chosen_policy", "policy_name",
           "policy_label", "policy_record", "options_record", "check_backend",
           "check_world_sizes", "where"]


def add_policy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="dfccl", metavar="POLICY",
                   help=f"the daemon's scheduling policy: one of {', '.join(policy_names())}, "
                        "an installed plugin's name, or package.module:name for a policy in a "
                        "module of your own (its folder on PYTHONPATH)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter of the daemon's policy (repeatable; GPU times "
                        "in ns), e.g. --param HEAD_BASE=20000; baselines keep theirs")


def chosen_policy(args: argparse.Namespace) -> tuple[Policy, dict]:
    """The policy ``--policy`` names with ``--param``'s overrides, built once here and
    passed as an object down to ``launch``, and the overrides ({name: int}). A malformed
    item or a parameter the policy lacks is a UsageError."""
    try:
        policy = get_policy(args.policy)
    except ValueError as exc:
        raise UsageError(f"--policy {exc}") from None
    try:
        params = parse_params(args.param)
        return policy.with_params(**params), params
    except ValueError as exc:
        raise UsageError(f"--param {exc}") from None


def policy_name(policy: Policy | str) -> str:
    """What ``--policy`` takes to get ``policy`` again: its registered name, or
    ``module:name`` for a policy from a module of one's own."""
    return policy if isinstance(policy, str) else spec_of(policy)


def policy_label(policy: Policy | str, overrides: dict) -> str:
    """``dfccl BASE=7 HEAD_BASE=9``: the name and the overrides the command line gave."""
    return " ".join([policy_name(policy)] + [f"{k}={v}" for k, v in overrides.items()])


def policy_record(policy: Policy | str) -> dict:
    """A policy as JSON can hold it: its name and, for an object, its parameters (the
    functions are code, named by the policy's name)."""
    if isinstance(policy, str):
        return dict(name=policy)
    return dict(name=policy_name(policy), params=dict(policy.params),
                sim_params=dict(policy.sim_params))


def options_record(opts) -> dict:
    """A command's options dataclass as JSON holds it, its policy by ``policy_record``."""
    return dict({f.name: getattr(opts, f.name) for f in fields(opts)},
                policy=policy_record(opts.policy))


def check_backend(backend: str | None) -> None:
    """The threads backend puts every rank on this process's GPU: without one, say so
    before a launch fails inside."""
    try:
        chosen = backend or default_backend()
    except ValueError as exc:       # PYDFCCL_BACKEND names none
        raise UsageError(str(exc)) from None
    if chosen == "threads" and not on_gpu():
        raise UsageError("--backend threads needs a GPU (the simulator runs a process per "
                         "rank: --backend processes)")


def check_world_sizes(nranks: int, flags: dict | None = None, **sizes) -> None:
    """World sizes given on the command line (None: the default), checked as
    :class:`WorldConfig` will check them in the launch; the message names the option,
    ``--slot-bytes`` for slot_bytes or what ``flags`` maps a size to."""
    given = {k: v for k, v in sizes.items() if v is not None}
    try:
        WorldConfig(nranks, simulator=not on_gpu(), **given)
    except ValueError as exc:
        name, _, rest = str(exc).replace("WorldConfig: ", "").partition(" ")
        flag = (flags or {}).get(name) or (f"--{name.replace('_', '-')}" if name in given
                                           else name)
        raise UsageError(f"{flag} {rest}") from None


def where() -> str:
    """Where the kernels run, for a header line."""
    return "GPU" if on_gpu() else "CUDA simulator (CPU)"
