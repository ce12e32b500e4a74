"""Scheduling: the policies the daemon runs, a host-side model of the daemons, and the
deadlock-risk study. Pure Python and numpy; nothing here touches a GPU or imports Numba."""

from .policies import NEVER, PARAM_SLOTS, Param, Policy, get_policy, policy_names, register
from .model import (COMPLETED, DEADLOCK, LIVELOCK, SYNC, WAIT_ALL, Collective, Event, Result,
                    Schedule, find_wait_cycle, ring_steps, run_schedule, submit)
from .risk import (PRESETS, RiskRow, Round, Topology, find_deadlock, make_round, plot,
                   risk_study, sample_round, simulate_round, wilson_interval, write_csv)

# risk.main stays in its module: `python -m pydfccl risk` calls pydfccl.sched.risk.main.
__all__ = [
    "NEVER", "PARAM_SLOTS", "Param", "Policy", "get_policy", "policy_names", "register",
    "COMPLETED", "DEADLOCK", "LIVELOCK", "SYNC", "WAIT_ALL", "Collective", "Event", "Result",
    "Schedule", "find_wait_cycle", "ring_steps", "run_schedule", "submit",
    "PRESETS", "RiskRow", "Round", "Topology", "find_deadlock", "make_round", "plot",
    "risk_study", "sample_round", "simulate_round", "wilson_interval", "write_csv",
]
