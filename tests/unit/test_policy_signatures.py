"""The policy functions' signatures: budgets that see the collective's priority, a word per
task that ``remember`` keeps across preemptions and reloads (in the model here; on the
engine in tests/ranks/test_policy_word.py), and functions of the older signatures adapted,
or refused with the signature to write."""

import pickle

import pytest

from pydfccl.kernels.policy_types import check_policy_types
from pydfccl.sched import Schedule, run_schedule
from pydfccl.sched.policies import PREEMPTED, Param, Policy, get_policy
from pydfccl.sched.slots import unbound

TABLE = dict(BASE=Param.time(10_000), STEP=Param.time(5_000),
             QUIT_AFTER=Param.time(5_000_000, simulator=50_000_000, model=2_000))


def submission_order(params, priority, seq, coll):
    return seq


def quit_when_idle(params, idle):
    if idle >= params[QUIT_AFTER]:
        return 1
    return 0


def keep(params, threshold, waited, priority):
    return threshold


def once(params, is_head, priority):
    return 1


def recording(log, remembers=True):
    """A policy whose budget is BASE << priority plus STEP per preemption its word
    counted; each load logs (priority, try_count, memo, budget)."""
    def on_load(params, is_head, try_count, priority, memo):
        budget = (params[BASE] << priority) + params[STEP] * memo
        log.append((priority, try_count, memo, budget))
        return budget

    def count_preemptions(params, memo, threshold, waited, priority):
        return memo + 1 if waited == PREEMPTED else memo

    extra = dict(remember=count_preemptions) if remembers else {}
    return Policy("recording", on_load, keep, once, submission_order, quit_when_idle,
                  parameters=TABLE, **extra)


# Three collectives at priorities 0, 1, 2; rank 1 starts late and in the opposite order,
# so that rank 0 preempts each of them pass after pass. (A quiet window given: the model
# derives its own from the budget function, whose probes would fill the log.)
HELD = Schedule.from_orders([[0, 1, 2], [2, 1, 0]], counts=3, priorities={0: 0, 1: 1, 2: 2})
RUN = dict(start_ticks=[0, 300], max_quiet_ticks=100_000)


def test_the_model_gives_each_priority_its_budget_and_keeps_the_word_across_reloads():
    log = []
    policy = recording(log)
    result = run_schedule(HELD, policy, **RUN)
    assert result.outcome == "completed" and result.exact and result.preemptions > 3
    first = {prio: budget for prio, tries, memo, budget in log if memo == 0}
    base, step = policy.values(model=True)["BASE"], policy.values(model=True)["STEP"]
    assert first == {0: base, 1: base << 1, 2: base << 2}
    # one load a pass, each ended by a preemption until the last: the word counted them
    assert all(memo == tries - 1 for prio, tries, memo, budget in log), log
    assert max(memo for _, _, memo, _ in log) >= 2
    assert all(budget == (base << prio) + step * memo for prio, _, memo, budget in log)


def test_without_remember_the_word_stays_zero():
    log = []
    run_schedule(HELD, recording(log, remembers=False), **RUN)
    assert log and {memo for _, _, memo, _ in log} == {0}
    assert not recording([], remembers=False).remembers and recording([]).remembers


# --- the older signatures ----------------------------------------------------------------

def old_on_load(params, is_head, try_count):
    return params[BASE] * try_count


def old_after_wait(params, threshold, waited):
    return threshold + params[STEP]


def old_tries(params, is_head):
    if is_head:
        return 3
    return 1


def new_on_load(params, is_head, try_count, priority, memo):
    return params[BASE] * try_count


def new_after_wait(params, threshold, waited, priority):
    return threshold + params[STEP]


def new_tries(params, is_head, priority):
    if is_head:
        return 3
    return 1


OLD = Policy("old", old_on_load, old_after_wait, old_tries, submission_order,
             quit_when_idle, parameters=TABLE)
NEW = Policy("new", new_on_load, new_after_wait, new_tries, submission_order,
             quit_when_idle, parameters=TABLE)


def test_old_signatures_are_adapted_and_run_as_the_new_ones_would():
    params = OLD.param_array()
    assert OLD.threshold_on_load(params, 1, 4, 2, 99) == 4 * 10_000
    assert OLD.threshold_after_wait(params, 7, 3, 2) == 7 + 5_000
    assert OLD.tries_per_pass(params, 1, 2) == 3
    sched = Schedule.from_orders([[0, "sync", 1, 2], [2, 1, "sync", 0], [1, 2, 0]], counts=5)
    assert run_schedule(sched, OLD) == run_schedule(sched, NEW)
    check_policy_types(OLD)                       # as the device compiles them
    assert unbound(OLD.threshold_on_load) is old_on_load
    copy = pickle.loads(pickle.dumps(OLD))        # a rank process gets the functions as
    assert copy.functions == OLD.functions        # written, and adapts them again


def test_an_old_signature_defined_in_a_function_keeps_its_closure():
    def make(tries):
        def tries_per_pass(params, is_head):
            return tries if is_head else 1
        return tries_per_pass

    policy = Policy("closure", new_on_load, new_after_wait, make(4), submission_order,
                    quit_when_idle, parameters=TABLE)
    assert policy.tries_per_pass(policy.param_array(), 1, 0) == 4
    check_policy_types(policy)


def test_what_cannot_be_adapted_is_refused_with_the_signature_to_write():
    with pytest.raises(TypeError, match=r"threshold_on_load \(.*<lambda>\) is a lambda of the "
                       r"older signature.*threshold_on_load\(params, is_head, try_count, "
                       r"priority, memo\)"):
        Policy("p", lambda params, is_head, try_count: 1, new_after_wait, new_tries,
               submission_order, quit_when_idle, parameters=TABLE)

    def four(params, is_head, try_count, priority):
        return 1

    with pytest.raises(TypeError, match=r"threshold_on_load \(.*four\) takes 4 positional "
                       r"arguments; the daemon calls threshold_on_load\(params, is_head, "
                       r"try_count, priority, memo\)"):
        Policy("p", four, new_after_wait, new_tries, submission_order, quit_when_idle,
               parameters=TABLE)


def test_a_table_passed_where_remember_goes_is_refused():
    nccl = get_policy("nccl")
    with pytest.raises(TypeError, match="remember; pass the table as parameters="):
        Policy("p", *nccl.functions[:5], dict(QUIT_AFTER=Param.time(1000)))
