"""Scheduling policies, written once in plain numeric Python.

A policy decides, for the daemon of each rank, how long a primitive may wait before its
collective is preempted, in which order waiting collectives are tried, and when the daemon
quits voluntarily. The same five functions run on the host, in the model
(:mod:`pydfccl.sched.model`) and, compiled by Numba, inside the daemon kernel, so what the
model says is what the GPU does.

Rules for the functions (so that Numba can compile them for the device): integer arithmetic
only, parameters read from ``params`` (a 1-D int64 array, ``PARAM_SLOTS`` long) by index,
no Python objects, no globals other than integer constants.

Time is in nanoseconds on the GPU (``%globaltimer``) and in the simulator
(``perf_counter_ns``), and in ticks in the model (one tick: one check of a primitive's
condition), so the same functions serve all three; each backend has its own parameters.

The five functions, with ``params`` first:

``threshold_on_load(params, is_head, try_count)``
    the time each primitive may wait when a task is (re)loaded; ``try_count`` counts loads
    of this task instance, starting at 1; ``is_head`` is 1 for the first task in order.
``threshold_after_wait(params, threshold, waited)``
    new budget after a primitive waited ``waited`` and then succeeded (stickiness).
``tries_per_pass(params, is_head)``
    how many times a task is loaded in one pass over the task list.
``order_key(params, priority, seq, coll)``
    tasks run in increasing key order; ``seq`` is the per-rank submission number and
    ``coll`` the collective's index (the same on every rank: ids sorted).
``should_quit(params, idle)``
    1 when the daemon should exit, ``idle`` being the time since its rank's last progress,
    any block's (waiting on stuck tasks or polling an empty queue).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict

import numpy as np

__all__ = [
    "PARAM_SLOTS",
    "NEVER",
    "Policy",
    "register",
    "get_policy",
    "policy_names",
]

PARAM_SLOTS = 8
NEVER = 1 << 62  # a wait budget that is never reached


@dataclass(frozen=True)
class Policy:
    """A named set of policy functions plus their integer parameters.

    ``params`` maps parameter names to default values on the GPU (times in nanoseconds);
    ``sim_params`` overrides some of them for the CPU simulator, whose steps take
    milliseconds, and ``model_params`` for the model, whose time unit is a tick.
    Parameters are data, so changing them never recompiles the daemon; the functions are
    code, so a new policy compiles one new daemon kernel (cached on disk).
    """

    name: str
    threshold_on_load: Callable
    threshold_after_wait: Callable
    tries_per_pass: Callable
    order_key: Callable
    should_quit: Callable
    params: Dict[str, int]
    sim_params: Dict[str, int] = field(default_factory=dict)
    model_params: Dict[str, int] = field(default_factory=dict)
    preemptive: bool = True
    # False when ``should_quit`` never says yes: the host then holds device frees while the
    # daemon runs (``platform.deferred_frees``), since each would wait for it.
    quits: bool = True

    def with_params(self, **overrides) -> "Policy":
        unknown = set(overrides) - set(self.params)
        if unknown:
            raise ValueError(f"policy {self.name!r} has no parameter(s) {sorted(unknown)}; "
                             f"known: {sorted(self.params)}")
        params = dict(self.params, **overrides)
        sim = {k: v for k, v in self.sim_params.items() if k not in overrides}
        model = {k: v for k, v in self.model_params.items() if k not in overrides}
        return replace(self, params=params, sim_params=sim, model_params=model)

    def param_array(self, simulator: bool = False, model: bool = False) -> np.ndarray:
        """The parameters in slot order, as the kernel and the model read them."""
        values = dict(self.params)
        if simulator:
            values.update(self.sim_params)
        if model:
            values.update(self.model_params)
        if len(values) > PARAM_SLOTS:
            raise ValueError(f"policy {self.name!r} has more than {PARAM_SLOTS} parameters")
        out = np.zeros(PARAM_SLOTS, dtype=np.int64)
        out[: len(values)] = [int(v) for v in values.values()]
        return out

    @property
    def functions(self):
        return (self.threshold_on_load, self.threshold_after_wait, self.tries_per_pass,
                self.order_key, self.should_quit)


# --- dfccl: the paper's stickiness ---------------------------------------------------------
# params: 0 BASE, 1 FACTOR, 2 NUM_TRY, 3 QUIT_AFTER, 4 PRIORITY_SHIFT, 5 ORDER_BY_ID,
# 6 HEAD_BASE

def _dfccl_threshold_on_load(params, is_head, try_count):
    """BASE, or for the queue head HEAD_BASE if larger, times the loads so far, up to
    NUM_TRY. The paper gives the head "a high initial threshold so it can wait for its
    peers"; the original code, and our default (HEAD_BASE 0), give it BASE and more tries
    per pass instead (``tries_per_pass``)."""
    base = max(params[0], params[6]) if is_head else params[0]
    return base * min(try_count, params[2])


def _dfccl_threshold_after_wait(params, threshold, waited):
    return max(threshold, params[1] * waited)


def _dfccl_tries_per_pass(params, is_head):
    if is_head:
        return params[2]
    return 1


def _priority_then_agreed(params, priority, seq, coll):
    """Higher priority first; then, with ORDER_BY_ID (params[5]) set, the collective's index,
    an order every rank agrees on, so that once the same tasks wait everywhere every rank
    tries the same head (the paper orders by per-rank arrival; set ORDER_BY_ID=0 for that)."""
    if params[5] != 0:
        return coll - (priority << params[4])
    return seq - (priority << params[4])


def _quit_after_idle(params, idle):
    if idle >= params[3]:
        return 1
    return 0


# --- fixed: one constant threshold, no stickiness --------------------------------------------
# params: 0 THRESHOLD, 1-2 unused, 3 QUIT_AFTER, 4 PRIORITY_SHIFT, 5 ORDER_BY_ID

def _fixed_threshold_on_load(params, is_head, try_count):
    return params[0]


def _keep_threshold(params, threshold, waited):
    return threshold


def _once_per_pass(params, is_head):
    return 1


# --- nccl: never preempt, submission order, never quit -------------------------------------

def _never_threshold(params, is_head, try_count):
    return NEVER


def _submission_order(params, priority, seq, coll):
    return seq


def _never_quit(params, idle):
    return 0


# --- patient_head: our own; the head waits long, the others barely ---------------------------
# The head is the task every rank most likely runs next, so it gets a budget that grows with
# how long it has been tried; other tasks are only probed (a tenth of BASE) so that a rank
# that is ahead does not keep its peers waiting for data it could already send.
# params: as dfccl

def _patient_head_threshold_on_load(params, is_head, try_count):
    if is_head:
        return params[0] * min(try_count, 4 * params[2])
    return max(params[0] // 10, 1)


_REGISTRY: Dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Make ``policy`` selectable by name (``launch(..., policy=name)``, ``--policy``)."""
    _REGISTRY[policy.name] = policy
    return policy


def get_policy(policy) -> Policy:
    if isinstance(policy, Policy):
        return policy
    try:
        return _REGISTRY[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}; known: {policy_names()}") from None


def policy_names():
    return sorted(_REGISTRY)


# Nanoseconds on the GPU; the simulator's steps take milliseconds, so its budgets are larger.
_STICKY = dict(BASE=20_000, FACTOR=5, NUM_TRY=5, QUIT_AFTER=5_000_000, PRIORITY_SHIFT=40,
               ORDER_BY_ID=1)
_STICKY_SIM = dict(BASE=2_000_000, QUIT_AFTER=50_000_000)
_STICKY_MODEL = dict(BASE=20, QUIT_AFTER=2_000)
# HEAD_BASE 0: the head starts from BASE, as in the original code. On the H200 head budgets
# of 100 us and 1 ms cut in-order preemptions tenfold and to none without moving the in-order
# ratio to the nccl policy out of its spread between calls (docs/benchmarks.md, "After
# midnight, December 1"); it stays a parameter to try (--param HEAD_BASE=NS).
register(Policy("dfccl", _dfccl_threshold_on_load, _dfccl_threshold_after_wait,
                _dfccl_tries_per_pass, _priority_then_agreed, _quit_after_idle,
                dict(_STICKY, HEAD_BASE=0), dict(_STICKY_SIM), dict(_STICKY_MODEL)))
register(Policy("fixed", _fixed_threshold_on_load, _keep_threshold, _once_per_pass,
                _priority_then_agreed, _quit_after_idle,
                dict(THRESHOLD=50_000, UNUSED1=0, UNUSED2=0, QUIT_AFTER=5_000_000,
                     PRIORITY_SHIFT=40, ORDER_BY_ID=1),
                dict(THRESHOLD=5_000_000, QUIT_AFTER=50_000_000),
                dict(THRESHOLD=50, QUIT_AFTER=2_000)))
register(Policy("nccl", _never_threshold, _keep_threshold, _once_per_pass, _submission_order,
                _never_quit, dict(UNUSED=0), preemptive=False, quits=False))
# The launch-per-collective baseline: nccl's behaviour, but the kernel exits as soon as the
# queue is empty (the host launches it once per collective).
register(Policy("launch_per_call", _never_threshold, _keep_threshold, _once_per_pass,
                _submission_order, _quit_after_idle,
                dict(UNUSED0=0, UNUSED1=0, UNUSED2=0, QUIT_AFTER=0), preemptive=False))
register(Policy("patient_head", _patient_head_threshold_on_load, _dfccl_threshold_after_wait,
                _dfccl_tries_per_pass, _priority_then_agreed, _quit_after_idle,
                dict(_STICKY), dict(_STICKY_SIM), dict(_STICKY_MODEL)))
