"""Scheduling policies, written once in plain numeric Python.

A policy decides, for the daemon of each rank, how long a primitive may wait before its
collective is preempted, in which order waiting collectives are tried, and when the daemon
quits voluntarily. The same functions run on the host, in the model
(:mod:`pydfccl.sched.model`) and, compiled by Numba, inside the daemon kernel, so what the
model says is what the GPU does.

Parameters are data: a table of :class:`~pydfccl.sched.params.Param` by name, which the
host writes into an int64 array (``PARAM_SLOTS`` long) for the daemon. The functions read
it by name, ``params[QUIT_AFTER]``: each parameter's name is its slot (:mod:`.slots`), so
the table's order cannot change what a function reads.

Rules for the functions (so that Numba can compile them for the device): integer arithmetic
only, parameters read as ``params[NAME]`` for a declared NAME, no Python objects, no globals
other than integer constants.

Time is in nanoseconds on the GPU (``%globaltimer``) and in the simulator
(``perf_counter_ns``), and in ticks in the model (one tick: one check of a primitive's
condition), so the same functions serve all three; a ``time`` parameter takes each
backend's unit (:mod:`.params`).

The functions, with ``params`` first (:mod:`.signatures` holds the table; functions of the
older signatures, without ``priority`` and ``memo``, are adapted):

``threshold_on_load(params, is_head, try_count, priority, memo)``
    the time each primitive may wait when a task is (re)loaded; ``try_count`` counts loads
    of this task instance, starting at 1; ``is_head`` is 1 for the first task in order;
    ``priority`` is the collective's; ``memo`` is the task's policy word (``remember``).
``threshold_after_wait(params, threshold, waited, priority)``
    new budget after a primitive waited ``waited`` and then succeeded (stickiness).
``tries_per_pass(params, is_head, priority)``
    how many times a task is loaded in one pass over the task list.
``order_key(params, priority, seq, coll)``
    tasks run in increasing key order; ``seq`` is the per-rank submission number and
    ``coll`` the collective's index (the same on every rank: ids sorted).
``should_quit(params, idle)``
    1 when the daemon should exit, ``idle`` being the time since its rank's last progress,
    any block's (waiting on stuck tasks or polling an empty queue).
``remember(params, memo, threshold, waited, priority)`` (optional; default: keep ``memo``)
    the task's new policy word, once each wait ends: after a success with the budget
    ``threshold_after_wait`` returned, and at a preemption with ``waited`` = ``PREEMPTED``
    (-1) and the budget that ran out. The word is part of the task's saved context: 0 when
    a run starts, kept across preemptions and reloads, read by ``threshold_on_load``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Dict, Mapping

import numpy as np

from .params import NEVER, Param, backend
from .signatures import PREEMPTED, ROLES, adapt
from .slots import bind, unbound

__all__ = [
    "PARAM_SLOTS",
    "NEVER",
    "PREEMPTED",
    "Param",
    "Policy",
    "register",
    "get_policy",
    "policy_names",
]

PARAM_SLOTS = 8


def _keep_memo(params, memo, threshold, waited, priority):
    """The default ``remember``: the policy word stays as it is (0)."""
    return memo


@dataclass(frozen=True)
class Policy:
    """A named set of policy functions plus their parameter table.

    ``parameters`` maps each name to a :class:`Param`: its value on the GPU (times in
    nanoseconds), its kind, and where needed its own value on the simulator or the model;
    the slots follow the table's order, and the functions read them by name. Parameters
    are data, so changing them never recompiles the daemon; the functions are code, so a
    new policy compiles one new daemon kernel (cached on disk). ``remember`` keeps a word
    per task across reloads; without it the word stays 0. Pass the table as
    ``parameters=``: the argument after ``should_quit`` is ``remember``.
    """

    name: str
    threshold_on_load: Callable
    threshold_after_wait: Callable
    tries_per_pass: Callable
    order_key: Callable
    should_quit: Callable
    remember: Callable = _keep_memo
    parameters: Mapping[str, Param] = field(default_factory=dict)
    preemptive: bool = True
    # False when ``should_quit`` never says yes: the host then holds device frees while the
    # daemon runs (``platform.deferred_frees``), since each would wait for it.
    quits: bool = True

    def __post_init__(self):
        if isinstance(self.remember, Mapping):
            raise TypeError(f"policy {self.name!r}: the argument after should_quit is "
                            "remember; pass the table as parameters=...")
        table = dict(self.parameters)
        for name, param in table.items():
            if not (isinstance(name, str) and name.isidentifier()):
                raise ValueError(f"policy {self.name!r}: parameter name {name!r} is not an "
                                 "identifier")
            if not isinstance(param, Param):
                raise TypeError(f"policy {self.name!r}: parameter {name}={param!r}: declare "
                                "it with Param.time, Param.count or Param.flag (its kind says "
                                "how it carries over to the simulator and the model)")
        if len(table) > PARAM_SLOTS:
            raise ValueError(f"policy {self.name!r} has more than {PARAM_SLOTS} parameters")
        object.__setattr__(self, "parameters", table)
        for role in ROLES:
            fn = adapt(unbound(getattr(self, role)), role, self.name)
            object.__setattr__(self, role, bind(fn, self.slots, self.name))

    def __reduce__(self):
        # the bound copies are not importable by name; the functions as written are
        return (Policy, (self.name, *map(unbound, self.functions), self.parameters,
                         self.preemptive, self.quits))

    @property
    def slots(self) -> Dict[str, int]:
        """Each parameter's slot in ``param_array``: its place in the table."""
        return {name: i for i, name in enumerate(self.parameters)}

    def values(self, simulator: bool = False, model: bool = False) -> Dict[str, int]:
        """Each parameter's value on the GPU, or on the simulator or in the model."""
        where = backend(simulator, model)
        return {name: p.on(where) for name, p in self.parameters.items()}

    def param_array(self, simulator: bool = False, model: bool = False) -> np.ndarray:
        """The parameters in slot order, as the kernel and the model read them."""
        out = np.zeros(PARAM_SLOTS, dtype=np.int64)
        out[: len(self.parameters)] = list(self.values(simulator, model).values())
        return out

    def with_params(self, **overrides) -> "Policy":
        """The policy with some parameters changed, keeping its functions (and compiled
        daemon). An integer is taken as is on every backend; a :class:`Param` declares the
        parameter anew, scaled as its kind says."""
        unknown = set(overrides) - set(self.parameters)
        if unknown:
            raise ValueError(f"policy {self.name!r} has no parameter(s) {sorted(unknown)}; "
                             f"known: {sorted(self.parameters)}")
        table = dict(self.parameters)
        for name, value in overrides.items():
            try:
                table[name] = value if isinstance(value, Param) else \
                    Param.fixed(value, table[name].kind)
            except ValueError as exc:
                raise ValueError(f"policy {self.name!r}, {name}: {exc}") from None
        return replace(self, parameters=table)

    # The tables by backend as plain integers, for callers that read them by name.
    @property
    def params(self) -> Dict[str, int]:
        """The GPU's values by name."""
        return self.values()

    @property
    def sim_params(self) -> Dict[str, int]:
        """The simulator's values where they differ from the GPU's."""
        gpu = self.values()
        return {k: v for k, v in self.values(simulator=True).items() if v != gpu[k]}

    @property
    def model_params(self) -> Dict[str, int]:
        """The model's values where they differ from the GPU's."""
        gpu = self.values()
        return {k: v for k, v in self.values(model=True).items() if v != gpu[k]}

    @property
    def functions(self):
        """The six functions in the order of :data:`.signatures.ROLES` (``remember`` last)."""
        return tuple(getattr(self, role) for role in ROLES)

    @property
    def remembers(self) -> bool:
        """Whether the policy keeps a word per task (a ``remember`` of its own)."""
        return unbound(self.remember) is not _keep_memo


# --- dfccl: the paper's stickiness ---------------------------------------------------------

def _dfccl_threshold_on_load(params, is_head, try_count, priority, memo):
    """BASE, or for the queue head HEAD_BASE if larger, times the loads so far, up to
    NUM_TRY. The paper gives the head "a high initial threshold so it can wait for its
    peers"; the original code, and our default (HEAD_BASE 0), give it BASE and more tries
    per pass instead (``tries_per_pass``)."""
    base = max(params[BASE], params[HEAD_BASE]) if is_head else params[BASE]
    return base * min(try_count, params[NUM_TRY])


def _dfccl_threshold_after_wait(params, threshold, waited, priority):
    return max(threshold, params[FACTOR] * waited)


def _dfccl_tries_per_pass(params, is_head, priority):
    if is_head:
        return params[NUM_TRY]
    return 1


def _priority_then_agreed(params, priority, seq, coll):
    """Higher priority first; then, with ORDER_BY_ID set, the collective's index, an order
    every rank agrees on, so that once the same tasks wait everywhere every rank tries the
    same head (the paper orders by per-rank arrival; set ORDER_BY_ID=0 for that)."""
    if params[ORDER_BY_ID] != 0:
        return coll - (priority << params[PRIORITY_SHIFT])
    return seq - (priority << params[PRIORITY_SHIFT])


def _quit_after_idle(params, idle):
    if idle >= params[QUIT_AFTER]:
        return 1
    return 0


# --- fixed: one constant threshold, no stickiness --------------------------------------------

def _fixed_threshold_on_load(params, is_head, try_count, priority, memo):
    return params[THRESHOLD]


def _keep_threshold(params, threshold, waited, priority):
    return threshold


def _once_per_pass(params, is_head, priority):
    return 1


# --- nccl: never preempt, submission order, never quit -------------------------------------

def _never_threshold(params, is_head, try_count, priority, memo):
    return NEVER


def _submission_order(params, priority, seq, coll):
    return seq


def _never_quit(params, idle):
    return 0


# --- patient_head: our own; the head waits long, the others barely ---------------------------
# The head is the task every rank most likely runs next, so it gets a budget that grows with
# how long it has been tried; other tasks are only probed (a tenth of BASE) so that a rank
# that is ahead does not keep its peers waiting for data it could already send.

def _patient_head_threshold_on_load(params, is_head, try_count, priority, memo):
    if is_head:
        return params[BASE] * min(try_count, 4 * params[NUM_TRY])
    return max(params[BASE] // 10, 1)


_REGISTRY: Dict[str, Policy] = {}


def register(policy: Policy) -> Policy:
    """Make ``policy`` selectable by name (``launch(..., policy=name)``, ``--policy``)."""
    _REGISTRY[policy.name] = policy
    return policy


def get_policy(policy) -> Policy:
    """``policy`` itself, the registered policy of that name, or one found outside the
    package: ``package.module:name`` or an installed plugin (:mod:`.plugins`)."""
    if isinstance(policy, Policy):
        return policy
    if not isinstance(policy, str):
        raise ValueError(f"a policy is a name or a Policy, not {policy!r}")
    found = _REGISTRY.get(policy)
    if found is None:
        from .plugins import find

        found = find(policy)
        if found is None:
            raise ValueError(f"unknown policy {policy!r}; known: {policy_names()}, or "
                             "package.module:name for a policy in a module of your own")
        _REGISTRY[policy] = found
    return found


def policy_names():
    """The registered names and those installed plugins offer (``module:name`` keys of
    policies found in modules are left out)."""
    from .plugins import installed_names

    return sorted({n for n in _REGISTRY if ":" not in n} | set(installed_names()))


# The idle time after which a daemon quits has values of its own on the simulator (50 ms)
# and in the model (2,000 ticks), below the scaled 0.5 s and 5,000 ticks, so that idle
# daemons there quit soon.
_QUIT_AFTER = Param.time(5_000_000, simulator=50_000_000, model=2_000)
_STICKY = dict(BASE=Param.time(20_000), FACTOR=Param.count(5), NUM_TRY=Param.count(5),
               QUIT_AFTER=_QUIT_AFTER, PRIORITY_SHIFT=Param.count(40),
               ORDER_BY_ID=Param.flag(1))
# HEAD_BASE 0: the head starts from BASE, as in the original code. On the H200 head budgets
# of 100 us and 1 ms cut in-order preemptions tenfold and to none without moving the in-order
# ratio to the nccl policy out of its spread between calls; it stays a
# parameter to try (--param HEAD_BASE=NS).
register(Policy("dfccl", _dfccl_threshold_on_load, _dfccl_threshold_after_wait,
                _dfccl_tries_per_pass, _priority_then_agreed, _quit_after_idle,
                parameters=dict(_STICKY, HEAD_BASE=Param.time(0))))
register(Policy("fixed", _fixed_threshold_on_load, _keep_threshold, _once_per_pass,
                _priority_then_agreed, _quit_after_idle,
                parameters=dict(THRESHOLD=Param.time(50_000), QUIT_AFTER=_QUIT_AFTER,
                                PRIORITY_SHIFT=Param.count(40), ORDER_BY_ID=Param.flag(1))))
register(Policy("nccl", _never_threshold, _keep_threshold, _once_per_pass, _submission_order,
                _never_quit, preemptive=False, quits=False))
# The launch-per-collective baseline: nccl's behaviour, but the kernel exits as soon as the
# queue is empty (the host launches it once per collective).
register(Policy("launch_per_call", _never_threshold, _keep_threshold, _once_per_pass,
                _submission_order, _quit_after_idle,
                parameters=dict(QUIT_AFTER=Param.time(0)), preemptive=False))
register(Policy("patient_head", _patient_head_threshold_on_load, _dfccl_threshold_after_wait,
                _dfccl_tries_per_pass, _priority_then_agreed, _quit_after_idle,
                parameters=dict(_STICKY)))
