"""A policy's parameters: declared once by name, read by name, scaled per backend."""

import pickle
import sys

import pytest

from pydfccl.kernels.compiler import fingerprint
from pydfccl.sched.model import Schedule, run_schedule
from pydfccl.sched.params import MODEL, NEVER, SIMULATOR, Param
from pydfccl.sched.policies import Policy, get_policy, policy_names

BACKENDS = [dict(), dict(simulator=True), dict(model=True)]


def rebuilt(policy, table, name=None):
    """``policy``'s functions over another parameter table."""
    return Policy(name or policy.name, *policy.functions, parameters=table,
                  preemptive=policy.preemptive, quits=policy.quits)


def reversed_table(policy):
    return dict(reversed(list(policy.parameters.items())))


@pytest.mark.parametrize("name", policy_names())
def test_reordering_the_table_cannot_change_what_a_function_reads(name):
    """The slots move with the table; every function still reads the same values, so it
    returns the same on every backend, and the model runs the same."""
    policy = get_policy(name)
    flipped = rebuilt(policy, reversed_table(policy))
    if len(policy.parameters) > 1:
        assert flipped.slots != policy.slots
    for backend in BACKENDS:
        a, b = policy.param_array(**backend), flipped.param_array(**backend)
        assert policy.values(**backend) == flipped.values(**backend)
        for is_head in (0, 1):
            for tries in (1, 2, 7):
                assert policy.threshold_on_load(a, is_head, tries, 1, 9) == \
                    flipped.threshold_on_load(b, is_head, tries, 1, 9)
            assert policy.tries_per_pass(a, is_head, 1) == flipped.tries_per_pass(b, is_head, 1)
        for waited in (-1, 0, 3, 10 ** 7):
            assert policy.threshold_after_wait(a, 100, waited, 1) == \
                flipped.threshold_after_wait(b, 100, waited, 1)
            assert policy.remember(a, 5, 100, waited, 1) == \
                flipped.remember(b, 5, 100, waited, 1)
        assert policy.order_key(a, 2, 5, 3) == flipped.order_key(b, 2, 5, 3)
        for idle in (0, 1, 1999, 2000, 5 * 10 ** 6, 10 ** 9):
            assert policy.should_quit(a, idle) == flipped.should_quit(b, idle)
    sched = Schedule.from_orders([[0, "sync", 1], [1, 0]], counts=3)
    assert run_schedule(sched, flipped) == run_schedule(sched, policy)


def test_quit_after_stays_quit_after_when_another_parameter_takes_its_place():
    """Read by position, swapping two entries of a table made each function read the
    other's value; read by name, the swap only moves where the host writes them."""
    dfccl = get_policy("dfccl")
    order = list(dfccl.parameters)
    i, j = order.index("BASE"), order.index("QUIT_AFTER")
    order[i], order[j] = order[j], order[i]
    swapped = {name: dfccl.parameters[name] for name in order}
    policy = rebuilt(dfccl, swapped)
    assert policy.slots["QUIT_AFTER"] == 0 and policy.slots["BASE"] == 3
    params = policy.param_array()
    assert policy.threshold_on_load(params, 0, 1, 0, 0) == 20_000
    assert policy.should_quit(params, 4_999_999) == 0 and policy.should_quit(params, 5_000_000)


def test_functions_shared_between_policies_read_each_ones_own_layout():
    dfccl, fixed = get_policy("dfccl"), get_policy("fixed")
    assert dfccl.slots["QUIT_AFTER"] != fixed.slots["QUIT_AFTER"]
    for policy in (dfccl, fixed):
        params = policy.with_params(QUIT_AFTER=77).param_array()
        assert policy.should_quit(params, 76) == 0 and policy.should_quit(params, 77) == 1


def test_a_positional_read_is_refused():
    def by_position(params, idle):
        return 1 if idle >= params[3] else 0

    nccl = get_policy("nccl")
    with pytest.raises(ValueError, match=r"reads params\[3\] by position"):
        Policy("p", nccl.threshold_on_load, nccl.threshold_after_wait, nccl.tries_per_pass,
               nccl.order_key, by_position, parameters=dict(QUIT_AFTER=Param.time(1000)))


def test_an_undeclared_name_is_refused():
    def typo(params, idle):
        return 1 if idle >= params[QUIT_AFTR] else 0  # noqa: F821 (a slot of no table)

    nccl = get_policy("nccl")
    with pytest.raises(ValueError, match=r"QUIT_AFTR\], which the policy does not declare"):
        Policy("p", nccl.threshold_on_load, nccl.threshold_after_wait, nccl.tries_per_pass,
               nccl.order_key, typo, parameters=dict(QUIT_AFTER=Param.time(1000)))


def test_a_policy_module_edited_and_reloaded_is_checked_as_it_now_reads(tmp_path,
                                                                         monkeypatch):
    """Functions are found in their file's syntax tree, parsed once a file: a decorated
    one among them, and after an edit and a reload the new text, not the tree of before."""
    module = tmp_path / "edited_policy.py"
    body = """
import functools


def _same(fn):
    return functools.wraps(fn)(fn)


def _unused(params, idle):
    return 0


@_same
def quit_after(params, idle):
    return 1 if idle >= params[{index}] else 0
"""
    module.write_text(body.format(index="3"))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import edited_policy

    monkeypatch.setitem(sys.modules, "edited_policy", edited_policy)   # gone after the test
    nccl = get_policy("nccl")

    def make(fn):
        return Policy("edited", nccl.threshold_on_load, nccl.threshold_after_wait,
                      nccl.tries_per_pass, nccl.order_key, fn,
                      parameters=dict(QUIT_AFTER=Param.time(1000)))

    with pytest.raises(ValueError, match=r"quit_after: reads params\[3\] by position"):
        make(edited_policy.quit_after)
    module.write_text(body.format(index="QUIT_AFTER"))
    edited = importlib.reload(edited_policy)
    assert make(edited.quit_after).param_array()[0] == 1000


def test_a_parameter_may_not_take_the_name_of_a_global_the_function_reads():
    """nccl's threshold reads the module's NEVER; a parameter NEVER would replace it."""
    with pytest.raises(ValueError, match="NEVER has the name of a global"):
        rebuilt(get_policy("nccl"), dict(NEVER=Param.count(1)))


def test_a_plain_integer_in_the_table_is_refused_with_the_kinds_to_choose_from():
    with pytest.raises(TypeError, match="Param.time, Param.count or Param.flag"):
        rebuilt(get_policy("launch_per_call"), dict(QUIT_AFTER=0))


def test_times_scale_per_backend_and_counts_and_flags_do_not():
    base = Param.time(20_000)
    assert [base.on(b) for b in ("gpu", SIMULATOR, MODEL)] == [20_000, 2_000_000, 20]
    quit_after = Param.time(5_000_000, simulator=50_000_000, model=2_000)
    assert [quit_after.on(b) for b in ("gpu", SIMULATOR, MODEL)] == [5_000_000, 50_000_000,
                                                                       2_000]
    assert Param.time(300).on(MODEL) == 1            # a budget does not vanish
    assert Param.time(0).on(MODEL) == 0
    assert Param.time(NEVER).on(SIMULATOR) == NEVER   # never is never everywhere
    assert Param.count(5).on(SIMULATOR) == Param.count(5).on(MODEL) == 5
    assert Param.count(5, model=2).on(MODEL) == 2
    assert Param.flag(True).on(MODEL) == 1
    with pytest.raises(ValueError, match="0 or 1"):
        Param.flag(2)
    with pytest.raises(ValueError, match="negative"):
        Param.time(-1)


def test_overrides_hold_as_given_on_every_backend_or_scale_when_declared():
    dfccl = get_policy("dfccl")
    literal = dfccl.with_params(BASE=7)
    assert [literal.values(**b)["BASE"] for b in BACKENDS] == [7, 7, 7]
    declared = dfccl.with_params(BASE=Param.time(50_000))
    assert [declared.values(**b)["BASE"] for b in BACKENDS] == [50_000, 5_000_000, 50]
    assert literal.slots == dfccl.slots
    assert literal.functions == dfccl.functions        # the same compiled daemon
    with pytest.raises(ValueError, match="no parameter"):
        dfccl.with_params(STEP=1)
    with pytest.raises(ValueError, match="expected an integer"):
        dfccl.with_params(BASE="fast")


def test_a_policy_crosses_into_a_spawned_process_by_pickle():
    """launch(backend="processes") pickles the policy for each rank."""
    policy = get_policy("fixed").with_params(THRESHOLD=3)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.functions == policy.functions and copy.parameters == policy.parameters
    assert (copy.param_array(simulator=True) == policy.param_array(simulator=True)).all()


def test_the_daemons_cache_key_follows_the_layout_not_the_values():
    dfccl = get_policy("dfccl")
    assert fingerprint(dfccl.with_params(BASE=1, QUIT_AFTER=2)) == fingerprint(dfccl)
    assert fingerprint(rebuilt(dfccl, reversed_table(dfccl))) != fingerprint(dfccl)
    assert fingerprint(rebuilt(dfccl, dfccl.parameters)) == fingerprint(dfccl)
