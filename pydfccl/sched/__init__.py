"""Scheduling: the policies the daemon runs, a host-side model of the daemons, and the
deadlock-risk study. Pure Python and numpy; nothing here touches a GPU or imports Numba.

Every rank process imports the policies; the model and the risk study are imported when
one of their names is first used (PEP 562), so that a process that only runs collectives
does not pay for them.
"""

import importlib as _importlib

from .policies import NEVER, PARAM_SLOTS, Param, Policy, get_policy, policy_names, register

_MODEL = ("COMPLETED", "DEADLOCK", "LIVELOCK", "SYNC", "WAIT_ALL", "Collective", "Event",
          "Result", "Schedule", "find_wait_cycle", "ring_steps", "run_schedule", "submit")
# risk.main stays in its module: `python -m pydfccl risk` calls pydfccl.sched.risk.main.
_RISK = ("PRESETS", "RiskRow", "Round", "Topology", "find_deadlock", "make_round", "plot",
         "risk_study", "sample_round", "simulate_round", "wilson_interval", "write_csv")
# public name -> the module that defines it, imported on first use
_LAZY = {**{name: "model" for name in _MODEL}, **{name: "risk" for name in _RISK}}

__all__ = ["NEVER", "PARAM_SLOTS", "Param", "Policy", "get_policy", "policy_names",
           "register", *_MODEL, *_RISK]


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pydfccl.sched' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
