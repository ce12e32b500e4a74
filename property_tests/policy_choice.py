"""Which policies the property tests draw: every one of a family, or only the one that
``pytest property_tests --policy NAME`` (or ``PYDFCCL_POLICY=NAME``) names.

NAME is anything ``--policy`` takes: a registered name, an installed plugin's, or
``package.module:name``. ``conftest.py`` calls :func:`select` before the test modules are
imported, so an unknown name stops the run at once, not after a test has shrunk.
"""

from __future__ import annotations

from hypothesis import strategies as st

from pydfccl.sched import policies
from pydfccl.sched.params import NEVER, TIME

__all__ = ["select", "selected", "chosen", "only", "drawn_params", "note_counterexample"]

_SELECTED: list = []        # [(spec, Policy)] once a policy was named


def select(spec: str | None) -> None:
    """Run the property tests for ``spec`` alone (None: every policy); ValueError names an
    unknown one."""
    _SELECTED.clear()
    if spec:
        _SELECTED.append((spec, policies.get_policy(spec)))


def selected():
    """(spec, Policy) of the policy named, or None."""
    return _SELECTED[0] if _SELECTED else None


def chosen(family: list[str], preemptive: bool | None = None) -> list[str]:
    """``family``, or the named policy alone when one was named and it belongs to the
    family's kind (``preemptive`` True or False; None: any); [] when it does not."""
    if not _SELECTED:
        return list(family)
    spec, policy = _SELECTED[0]
    if preemptive is not None and policy.preemptive != preemptive:
        return []
    return [spec]


def only(name: str) -> bool:
    """Whether the tests of policy ``name`` (nccl, launch_per_call) run: no policy was
    named, or that one was."""
    return not _SELECTED or policies.get_policy(_SELECTED[0][0]).functions == \
        policies.get_policy(name).functions


def drawn_params(draw, name: str):
    """The policy with parameters drawn in sane ranges: budgets of none (one check) to a few
    hundred checks, quits after 1-2000 idle ticks. A policy of one's own draws each time
    parameter between 0 and its model value (NEVER stays); counts and flags keep theirs."""
    policy = policies.get_policy(name)
    if policy.name == "fixed" and "THRESHOLD" in policy.parameters:
        over = dict(THRESHOLD=draw(st.integers(0, 200), label="THRESHOLD"),
                    QUIT_AFTER=draw(st.integers(1, 2000), label="QUIT_AFTER"))
    elif policy.name in ("dfccl", "patient_head") and "BASE" in policy.parameters:
        over = dict(BASE=draw(st.integers(0, 60), label="BASE"),
                    FACTOR=draw(st.integers(1, 8), label="FACTOR"),
                    NUM_TRY=draw(st.integers(1, 6), label="NUM_TRY"),
                    QUIT_AFTER=draw(st.integers(1, 2000), label="QUIT_AFTER"))
        if policy.name == "dfccl":   # the head's first budget: the model's own (BASE) or longer
            over["HEAD_BASE"] = draw(st.sampled_from([0, 0, 100, 500]), label="HEAD_BASE")
    else:
        over = {}
        for pname, value in policy.values(model=True).items():
            if policy.parameters[pname].kind == TIME and 0 < value < NEVER:
                over[pname] = draw(st.integers(0, value), label=pname)
    return policy.with_params(**over)


def note_counterexample(schedule, policy, options) -> None:
    """On failure, Hypothesis prints the example as one counterexample file's JSON (the
    schedule, the policy as --policy takes it, the drawn parameters and run options): save
    it and run ``python -m pydfccl replay FILE``."""
    from hypothesis import note

    from pydfccl.sched.counterexample import Counterexample

    spec = selected()[0] if selected() else None
    found = Counterexample.of(schedule, policy, options=options)
    if spec is not None:
        found = Counterexample(schedule, spec, found.params, found.options)
    note("counterexample file (python -m pydfccl replay FILE): " + found.to_json())
