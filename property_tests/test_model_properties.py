"""Properties of the daemon model, each against an oracle derived without running it.

Oracles (why they hold: docs/scheduling.md, "What the model guarantees"):

- Preemptive policies (dfccl, fixed, patient_head) run every submitted collective eventually
  and quit when stuck, so device syncs never hurt; only ``wait_all`` blocks a host on
  completions. They complete iff the "c is submitted after a wait_all that follows d on some
  rank" graph over collectives is acyclic, and then every rank holds the exact sum.
- ``launch_per_call`` (NCCL: one collective at a time, in submission order, kernel ends when
  the queue is empty): completes iff all ranks submit in the same order; syncs and
  wait_alls change nothing. Otherwise the deadlock has a wait-for cycle through at least two
  collectives.
- ``nccl`` (the same, but the daemon never quits): as launch_per_call, and moreover a device
  sync after the rank's first submission never returns.
"""

import json

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from collective_draws import drawn_collectives
from policy_choice import chosen, drawn_params, note_counterexample, only
from pydfccl.sched import policies
from pydfccl.sched.model import COMPLETED, DEADLOCK, Event, Schedule, run_schedule, submit

# Every policy of each kind, or only the one `pytest property_tests --policy NAME` names.
PREEMPTIVE = chosen(["dfccl", "patient_head", "fixed"], preemptive=True)
NOT_PREEMPTIVE = "the policy named by --policy is not preemptive"


@st.composite
def schedules(draw, extras=("sync",)):
    """2-5 ranks, 1-4 collectives (all-reduces, and all_to_allvs of 0-3 elements a pair);
    each rank keeps a common order or permutes it, and may follow any submission by one of
    ``extras``. Shrinks towards all-reduces, agreeing ranks, no extras."""
    nranks = draw(st.integers(2, 5))
    ncolls = draw(st.integers(1, 4))
    counts = draw(st.lists(st.integers(1, 3 * nranks), min_size=ncolls, max_size=ncolls))
    prios = draw(st.lists(st.integers(0, 2), min_size=ncolls, max_size=ncolls))
    row = st.lists(st.integers(0, 3), min_size=nranks, max_size=nranks)
    splits = draw(st.lists(st.none() | st.lists(row, min_size=nranks, max_size=nranks),
                           min_size=ncolls, max_size=ncolls))
    common = list(range(ncolls))
    ranks = []
    for _ in range(nranks):
        order = draw(st.permutations(common)) if draw(st.booleans()) else common
        program = []
        for c in order:
            if draw(st.booleans()):             # something before this submission
                program.append(Event(draw(st.sampled_from(extras))))
            program.append(submit(c))
        if draw(st.booleans()):
            program.append(Event(draw(st.sampled_from(extras))))
        ranks.append(program)
    return Schedule(nranks, drawn_collectives(counts, prios, splits), ranks)


@st.composite
def run_options(draw, nranks):
    """How the run interleaves: tick order, host start offsets, slots, relaunch pause, and
    up to which size collectives run one-shot (0: none; the counts go up to 3 * nranks)."""
    return dict(
        seed=draw(st.none() | st.integers(0, 2 ** 16)),
        start_ticks=draw(st.none() | st.lists(st.integers(0, 40), min_size=nranks,
                                              max_size=nranks)),
        nslots=draw(st.integers(2, 4)),
        slot_elems=draw(st.integers(1, 3)),
        one_shot_elems=draw(st.sampled_from([0, 0, 1, 3, 15])),
        relaunch_ticks=draw(st.integers(1, 20)),
    )


def policy_params(draw, name):
    """Sane ranges: budgets of a few to a few hundred spins, quits after 1-2000 idle spins."""
    return drawn_params(draw, name)


def wait_all_cycle(schedule):
    """True if wait_alls make collectives wait on each other in a cycle (Kahn's algorithm)."""
    after = {c: set() for c in schedule.collectives}     # d -> collectives that wait for d
    for program in schedule.ranks:
        seen, waited = [], []
        for ev in program:
            if ev.op == "wait_all":
                waited = list(seen)
            elif ev.op == "submit":
                for d in waited:
                    after[d].add(ev.coll)
                seen.append(ev.coll)
    indegree = {c: 0 for c in after}
    for targets in after.values():
        for c in targets:
            indegree[c] += 1
    ready = [c for c, k in indegree.items() if k == 0]
    removed = 0
    while ready:
        d = ready.pop()
        removed += 1
        for c in after[d]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    return removed < len(after)


def check_cycle(cycle, schedule, one_shot_elems):
    """A reported cycle returns to its start and chains ranks that wait on each other: ring
    neighbours in a ring collective, any peers in a one-shot one or an all_to_allv."""
    assert cycle, "a deadlock without a wait-for cycle"
    nranks = schedule.nranks
    for (r, c, w), (nxt, _, _) in zip(cycle, cycle[1:] + cycle[:1]):
        assert w == nxt
        coll = schedule.collectives[c]
        if coll.kind == "all_to_allv" or coll.count <= one_shot_elems:
            assert w != r
        else:
            assert w in ((r - 1) % nranks, (r + 1) % nranks)
    assert len({c for _, c, _ in cycle}) >= 2, "one collective cannot deadlock by itself"


def assert_exact(res):
    assert all(v is not None for per_rank in res.values.values() for v in per_rank)
    assert res.exact, res.values


@pytest.mark.skipif(not PREEMPTIVE, reason=NOT_PREEMPTIVE)
@given(st.data(), st.sampled_from(PREEMPTIVE or ["dfccl"]), schedules())
def test_preemptive_policies_complete_with_exact_sums(data, name, schedule):
    policy = policy_params(data.draw, name)
    opts = data.draw(run_options(schedule.nranks), label="run options")
    note_counterexample(schedule, policy, opts)
    res = run_schedule(schedule, policy, **opts)
    event("preempted" if res.preemptions else "no preemption")
    event("relaunched" if res.relaunches else "no relaunch")
    assert res.outcome == COMPLETED, res.summary()
    assert_exact(res)


@pytest.mark.skipif(not PREEMPTIVE, reason=NOT_PREEMPTIVE)
@given(st.data(), st.sampled_from(PREEMPTIVE or ["dfccl"]),
       schedules(extras=("sync", "wait_all")))
def test_preemptive_policies_deadlock_exactly_on_wait_all_cycles(data, name, schedule):
    policy = policy_params(data.draw, name)
    opts = data.draw(run_options(schedule.nranks), label="run options")
    note_counterexample(schedule, policy, opts)
    res = run_schedule(schedule, policy, **opts)
    event(res.outcome)
    if wait_all_cycle(schedule):
        assert res.outcome == DEADLOCK, res.summary()
        assert set(res.blocked.values()) <= {"wait_all"}
    else:
        assert res.outcome == COMPLETED, res.summary()
        assert_exact(res)


@pytest.mark.skipif(not only("launch_per_call"), reason="another policy was named")
@given(st.data(), schedules(extras=("sync", "wait_all")))
def test_launch_per_call_completes_iff_all_ranks_agree(data, schedule):
    opts = data.draw(run_options(schedule.nranks), label="run options")
    note_counterexample(schedule, "launch_per_call", opts)
    res = run_schedule(schedule, "launch_per_call", **opts)
    event(res.outcome)
    orders = schedule.orders()
    if all(o == orders[0] for o in orders):
        assert res.outcome == COMPLETED, res.summary()
        assert_exact(res)
        assert res.preemptions == 0
    else:
        assert res.outcome == DEADLOCK, res.summary()
        check_cycle(res.cycle, schedule, opts["one_shot_elems"])


def sync_after_submit(program):
    return any(ev.op == "sync" for ev in program[next(
        (i for i, ev in enumerate(program) if ev.op == "submit"), len(program)):])


@pytest.mark.skipif(not only("nccl"), reason="another policy was named")
@given(st.data(), schedules(extras=("sync", "wait_all")))
def test_nccl_needs_agreement_and_no_sync_while_its_daemon_runs(data, schedule):
    opts = data.draw(run_options(schedule.nranks), label="run options")
    note_counterexample(schedule, "nccl", opts)
    res = run_schedule(schedule, "nccl", **opts)
    event(res.outcome)
    orders = schedule.orders()
    agree = all(o == orders[0] for o in orders)
    syncs = any(sync_after_submit(p) for p in schedule.ranks)
    if agree and not syncs:
        assert res.outcome == COMPLETED, res.summary()
        assert_exact(res)
    else:
        assert res.outcome == DEADLOCK, res.summary()
        if not agree and not syncs:
            check_cycle(res.cycle, schedule, opts["one_shot_elems"])
        if agree:
            assert "sync" in res.blocked.values()


@given(st.data(), st.sampled_from(chosen(["dfccl", "patient_head", "fixed", "nccl"])),
       schedules(extras=("sync",)))
def test_runs_are_deterministic(data, name, schedule):
    opts = data.draw(run_options(schedule.nranks), label="run options")
    params = policies.get_policy(name).param_array(model=True)
    assert run_schedule(schedule, name, params, **opts) == \
        run_schedule(schedule, name, params, **opts)


@given(schedules(extras=("sync", "wait_all")))
def test_schedule_json_round_trips(schedule):
    text = schedule.to_json()
    assert Schedule.from_json(text) == schedule
    assert json.loads(text)["nranks"] == schedule.nranks
