"""Policies that live outside pydfccl: ``package.module:name`` and installed plugins.

Every place that takes a policy by name (``--policy`` of every command, ``launch(policy=)``,
``run_schedule``, ``PYDFCCL_POLICY``, ``pytest property_tests --policy``) resolves it through
:func:`pydfccl.sched.policies.get_policy`, which asks :func:`find` for a name it has not
registered:

- ``package.module:name`` imports ``package.module`` and takes its attribute ``name``, a
  :class:`~pydfccl.sched.policies.Policy`; a module that registers its policies may also be
  named by a registered name (``doubling:doubling``);
- a name in the entry-point group ``pydfccl.policies`` (an installed package's
  ``[project.entry-points."pydfccl.policies"]``, ``doubling = "mypkg.doubling:policy"``)
  loads that entry point, a Policy.

A policy found so is registered under the name it was asked by, so it is imported once.
"""

from __future__ import annotations

import importlib
import sys
from importlib import metadata

__all__ = ["ENTRY_POINT_GROUP", "find", "installed_names", "spec_of"]

ENTRY_POINT_GROUP = "pydfccl.policies"


def installed_names() -> list[str]:
    """The names installed packages offer in the ``pydfccl.policies`` group."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def _as_policy(obj, where: str):
    from .policies import Policy, get_policy

    if isinstance(obj, Policy):
        return obj
    if isinstance(obj, str):          # the attribute names a policy the module registered
        return get_policy(obj)
    raise ValueError(f"{where} is a {type(obj).__name__}, not a pydfccl Policy "
                     "(make it with pydfccl.sched.policies.Policy(...))")


def _from_module(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"policy {spec!r}: expected package.module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"policy {spec!r}: cannot import {module_name} ({exc}); is its "
                         "folder on PYTHONPATH?") from None
    from .policies import _REGISTRY

    obj = getattr(module, attr, None)
    if obj is None and attr in _REGISTRY:   # the module registered it under that name
        return _REGISTRY[attr]
    if obj is None:
        raise ValueError(f"policy {spec!r}: module {module_name} has no attribute {attr!r}")
    return _as_policy(obj, f"policy {spec!r}")


def _from_entry_point(name: str):
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                obj = ep.load()
            except Exception as exc:    # an installed plugin that fails to import
                raise ValueError(f"policy {name!r} (entry point {ep.value} of group "
                                 f"{ENTRY_POINT_GROUP}) failed to load: "
                                 f"{type(exc).__name__}: {exc}") from None
            return _as_policy(obj, f"policy {name!r} (entry point {ep.value})")
    return None


def find(name: str):
    """The policy ``name`` names outside the registry, or None when nothing does."""
    if ":" in name:
        return _from_module(name)
    return _from_entry_point(name)


def spec_of(policy) -> str:
    """A string that :func:`~pydfccl.sched.policies.get_policy` turns back into ``policy``'s
    functions in another process: its registered name, or ``module:attribute`` where its
    module holds it (the functions' module), else its name."""
    from .policies import _REGISTRY
    from .slots import unbound

    functions = tuple(unbound(f) for f in policy.functions)

    def same(other):
        return tuple(unbound(f) for f in other.functions) == functions

    for key, known in _REGISTRY.items():
        if key == policy.name and same(known):
            return key
    for key, known in _REGISTRY.items():
        if ":" in key and same(known):
            return key
    module = sys.modules.get(getattr(functions[0], "__module__", ""), None)
    for attr, value in vars(module).items() if module else ():
        if type(value).__name__ == "Policy" and getattr(value, "name", None) == policy.name \
                and same(value):
            return f"{module.__name__}:{attr}"
    return policy.name
