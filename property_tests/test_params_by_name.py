"""Parameters are read by name: however a policy's table is ordered, and whatever values it
holds, its functions read the same values and the model runs the same.

Oracle: the registered policy itself. A copy of it with the table permuted (and the same
overrides) must agree with it on every function, every backend and every schedule; only
the slots, where the host writes each value, may differ.
"""

from hypothesis import given
from hypothesis import strategies as st

from policy_choice import chosen
from pydfccl.sched import policies
from pydfccl.sched.model import Schedule, run_schedule
from pydfccl.sched.params import COUNT, FLAG, TIME

BACKENDS = [dict(), dict(simulator=True), dict(model=True)]
VALUES = {TIME: st.integers(1, 500), COUNT: st.integers(1, 8), FLAG: st.integers(0, 1)}


@st.composite
def policy_pairs(draw):
    """A registered policy with some parameters overridden, and the same with its table in
    another order. Shrinks towards the table's own order and no overrides."""
    policy = policies.get_policy(draw(st.sampled_from(chosen(policies.policy_names()))))
    table = policy.parameters
    changed = draw(st.lists(st.sampled_from(sorted(table)), unique=True)) if table else []
    policy = policy.with_params(**{n: draw(VALUES[table[n].kind]) for n in changed})
    order = draw(st.permutations(list(policy.parameters)))
    permuted = policies.Policy(policy.name, *policy.functions,
                               parameters={n: policy.parameters[n] for n in order},
                               preemptive=policy.preemptive, quits=policy.quits)
    return policy, permuted


@st.composite
def small_schedules(draw):
    """2-3 ranks, 1-3 collectives, each rank in its own order, syncs anywhere."""
    nranks, ncolls = draw(st.integers(2, 3)), draw(st.integers(1, 3))
    orders = []
    for _ in range(nranks):
        order = []
        for c in draw(st.permutations(range(ncolls))):
            order += ["sync", c] if draw(st.booleans()) else [c]
        orders.append(order)
    return Schedule.from_orders(orders, counts=draw(st.integers(1, 4)))


@given(policy_pairs(), st.sampled_from(BACKENDS), st.integers(0, 1), st.integers(1, 64),
       st.integers(0, 1 << 40), st.integers(0, 1 << 40), st.integers(0, 3),
       st.integers(0, 1000), st.integers(0, 100))
def test_every_function_reads_the_same_values_in_any_order(pair, backend, is_head, tries,
                                                           threshold, waited, priority,
                                                           seq, coll):
    policy, permuted = pair
    assert policy.values(**backend) == permuted.values(**backend)
    a, b = policy.param_array(**backend), permuted.param_array(**backend)
    assert policy.threshold_on_load(a, is_head, tries, priority, threshold) == \
        permuted.threshold_on_load(b, is_head, tries, priority, threshold)
    assert policy.threshold_after_wait(a, threshold, waited, priority) == \
        permuted.threshold_after_wait(b, threshold, waited, priority)
    assert policy.remember(a, seq, threshold, waited, priority) == \
        permuted.remember(b, seq, threshold, waited, priority)
    assert policy.tries_per_pass(a, is_head, priority) == \
        permuted.tries_per_pass(b, is_head, priority)
    assert policy.order_key(a, priority, seq, coll) == permuted.order_key(b, priority, seq,
                                                                          coll)
    assert policy.should_quit(a, waited) == permuted.should_quit(b, waited)


@given(policy_pairs(), small_schedules(), st.none() | st.integers(0, 2 ** 16))
def test_the_model_runs_the_same_in_any_order(pair, schedule, seed):
    policy, permuted = pair
    assert run_schedule(schedule, permuted, seed=seed) == \
        run_schedule(schedule, policy, seed=seed)
