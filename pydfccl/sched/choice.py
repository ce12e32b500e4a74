"""Choosing a policy by name with parameter overrides, as the command line's ``--policy``
and ``--param`` and the variables ``PYDFCCL_POLICY`` and ``PYDFCCL_PARAMS`` do."""

from __future__ import annotations

import os

from .policies import Policy, get_policy

__all__ = ["parse_params", "policy_from_env"]


def parse_params(items: list[str]) -> dict:
    """``["BASE=100000", ...]`` as {name: int}; ValueError names a malformed item."""
    params = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise ValueError(f"{item!r}: expected NAME=INTEGER")
        params[name.strip()] = int(value)
    return params


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
