"""Deterministic unit tests of the daemon model (pydfccl.sched.model)."""

import json
import time

import pytest

from pydfccl.sched import policies
from pydfccl.sched.model import (COMPLETED, DEADLOCK, LIVELOCK, SYNC, WAIT_ALL, Collective,
                                 Schedule, find_wait_cycle, ring_steps, run_schedule,
                                 stream_wait, submit, wait)

PREEMPTIVE = ["dfccl", "fixed", "patient_head"]
ALL = PREEMPTIVE + ["nccl", "launch_per_call"]


def sim(policy):
    """The CPU-simulator parameters: short spin budgets and quick quits."""
    return policies.get_policy(policy).param_array(model=True)


def test_ring_steps_follow_the_nccl_ring_order():
    names = [name for name, _, _ in ring_steps(3)]
    assert names == ["send", "recvReduceSend", "recvReduceCopySend", "recvCopySend", "recv"]
    assert ring_steps(2)[0] == ("send", False, True) and ring_steps(2)[-1] == ("recv", True, False)


@pytest.mark.parametrize("policy", ALL)
def test_same_order_completes_with_exact_sums(policy):
    sched = Schedule.from_orders([[0, 1, 2]] * 3, counts=7)
    res = run_schedule(sched, policy)
    assert res.outcome == COMPLETED
    assert res.exact and all(v is not None for per_rank in res.values.values() for v in per_rank)
    assert res.expected[0] == [sum((r + 1) * (e + 1) for r in range(3)) for e in range(7)]
    assert res.completion_order == [[0, 1, 2]] * 3


def test_nccl_deadlocks_on_opposite_orders_and_names_the_cycle():
    res = run_schedule(Schedule.from_orders([[0, 1], [1, 0]]), "nccl")
    assert res.outcome == DEADLOCK
    assert res.cycle == [(0, 0, 1), (1, 1, 0)]
    assert res.preemptions == 0


def test_nccl_cycle_follows_the_ring():
    # ranks 0 and 2 agree, rank 1 does not: 0 waits on 2 (its prev) in c0, 2 on 1 in c0,
    # 1 on 0 in c1
    res = run_schedule(Schedule.from_orders([[0, 1], [1, 0], [0, 1]]), "nccl")
    assert res.outcome == DEADLOCK
    assert res.cycle == [(0, 0, 2), (2, 0, 1), (1, 1, 0)]


def test_one_shot_waits_on_every_peer():
    """The same disagreement with one-shot collectives: rank 1's recvReduceCopyAll of c1
    waits on ranks 0 and 2; ranks 0 and 2 hold each other's input of c0 and wait on rank 1
    alone."""
    res = run_schedule(Schedule.from_orders([[0, 1], [1, 0], [0, 1]]), "nccl",
                       one_shot_elems=1)
    assert res.outcome == DEADLOCK
    assert res.waits == {0: [(0, 1)], 1: [(1, 0), (1, 2)], 2: [(0, 1)]}
    assert res.cycle == [(0, 0, 1), (1, 1, 0)]


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_one_shot_and_ring_collectives_complete_in_disorder(policy):
    """Collectives up to one_shot_elems run one-shot, larger ones in the ring (4 loops of
    slots of 4 on 3 ranks), side by side, every rank in its own order."""
    sched = Schedule.from_orders([[0, 1, 2], [2, 1, 0], [1, 0, 2]],
                                 counts={0: 3, 1: 40, 2: 4})
    res = run_schedule(sched, policy, slot_elems=4, one_shot_elems=4)
    assert res.outcome == COMPLETED and res.exact and res.preemptions > 0
    assert all(v is not None for per_rank in res.values.values() for v in per_rank)


def test_replay_predicts_with_the_engines_one_shot_limit():
    """``replay.predict`` runs all_reduces the way the engine on the same world would: on
    the simulator's slots (256 bytes, lanes of 128 on 3 ranks) 32 float32 run one-shot, 33
    in the ring, which names only the previous rank."""
    from pydfccl.cli.replay import predict

    for count, rank1_waits in ((32, [(1, 0), (1, 2)]), (33, [(1, 0)])):
        sched = Schedule.from_orders([[0, 1], [1, 0], [0, 1]], counts=count)
        res = predict(sched, "nccl", "float32", backend="processes")
        assert res.outcome == DEADLOCK
        assert res.waits[1] == rank1_waits, count


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_preemption_resolves_opposite_orders(policy):
    res = run_schedule(Schedule.from_orders([[0, 1], [1, 0]], counts=5), policy)
    assert res.outcome == COMPLETED and res.exact
    assert res.preemptions > 0


def test_dfccl_can_give_the_queue_head_a_higher_first_budget():
    """HEAD_BASE, when above BASE, is the head's first budget (the paper's "high initial
    threshold" for the head); the others start from BASE; each reload adds one more, up to
    NUM_TRY. The default (HEAD_BASE 0) starts every task from BASE, on every backend."""
    dfccl = policies.get_policy("dfccl")
    on_load = dfccl.threshold_on_load
    for backend in (dict(), dict(simulator=True), dict(model=True)):
        params = dfccl.param_array(**backend)
        base = dfccl.values(**backend)["BASE"]
        assert on_load(params, 1, 1, 0, 0) == on_load(params, 0, 1, 0, 0) == base
    head = dfccl.with_params(HEAD_BASE=100_000).param_array()
    assert [on_load(head, 1, t, 0, 0) for t in (1, 2, 5, 9)] == \
        [100_000, 200_000, 500_000, 500_000]
    assert [on_load(head, 0, t, 0, 0) for t in (1, 2, 5, 9)] == \
        [20_000, 40_000, 100_000, 100_000]
    assert on_load(dfccl.with_params(BASE=300_000, HEAD_BASE=100_000).param_array(), 1, 1,
                   0, 0) == 300_000


def test_gpu_sized_budgets_stay_cheap():
    start = time.perf_counter()
    paper_order = policies.get_policy("dfccl").with_params(ORDER_BY_ID=0)
    res = run_schedule(Schedule.from_orders([[0, 1, 2], [2, 1, 0], [1, 2, 0]], counts=9),
                       paper_order, params=paper_order.param_array())  # GPU budgets as ticks
    assert res.outcome == COMPLETED and res.exact
    assert res.ticks > 10_000          # thousands of ticks per preemption...
    assert time.perf_counter() - start < 1.0   # ...skipped, not simulated one by one


SYNC_CYCLE = Schedule.from_orders([[0, "sync", 1], [1, "sync", 0]])


@pytest.mark.parametrize("policy", ["nccl", "launch_per_call"])
def test_sync_cycle_deadlocks_without_preemption(policy):
    res = run_schedule(SYNC_CYCLE, policy)
    assert res.outcome == DEADLOCK
    assert res.cycle == [(0, 0, 1), (1, 1, 0)]
    assert res.blocked == {0: "sync", 1: "sync"}


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_voluntary_quit_breaks_the_sync_cycle(policy):
    res = run_schedule(SYNC_CYCLE, policy, sim(policy))
    assert res.outcome == COMPLETED and res.exact
    assert res.quits >= 2 and res.relaunches >= 2


def test_without_quitting_the_sync_cycle_livelocks():
    never_quit = policies.get_policy("dfccl").with_params(QUIT_AFTER=1 << 60, BASE=10)
    res = run_schedule(SYNC_CYCLE, never_quit, max_quiet_ticks=20_000)
    assert res.outcome == LIVELOCK
    assert res.preemptions > 0 and res.quits == 0
    assert res.waits == {0: [(0, 1)], 1: [(1, 0)]}


def test_a_sync_never_returns_while_an_nccl_daemon_runs():
    # everything completes, but the persistent daemon never quits, so neither sync returns
    sched = Schedule.from_orders([[0, "sync"], [0, "sync"]])
    res = run_schedule(sched, "nccl")
    assert res.outcome == DEADLOCK and res.cycle is None
    assert res.blocked == {0: "sync", 1: "sync"}
    assert res.values[0] == [res.expected[0]] * 2
    # launch_per_call quits on an empty queue, like NCCL's per-collective kernels
    assert run_schedule(sched, "launch_per_call").outcome == COMPLETED


@pytest.mark.parametrize("policy", ALL)
def test_wait_all_cycle_deadlocks_every_policy(policy):
    # wait_all blocks the host on completions: no GPU-side scheduling can help
    sched = Schedule.from_orders([[0, "wait_all", 1], [1, "wait_all", 0]])
    res = run_schedule(sched, policy, sim(policy))
    assert res.outcome == DEADLOCK
    assert sorted(res.cycle) == [(0, 0, 1), (1, 1, 0)]


@pytest.mark.parametrize("policy", PREEMPTIVE)
def test_late_high_priority_collective_overtakes(policy):
    # collective 2 arrives last but has the highest priority; 0 is already running by then
    sched = Schedule.from_orders([[0, 1, 2]] * 2, counts={0: 16, 1: 4, 2: 4},
                                 priorities={2: 5})
    res = run_schedule(sched, policy, sim(policy))
    assert res.outcome == COMPLETED and res.exact
    assert res.completion_order == [[0, 2, 1]] * 2
    # the baseline ignores priorities
    assert run_schedule(sched, "nccl").completion_order == [[0, 1, 2]] * 2


@pytest.mark.parametrize("nranks,nslots,slot_elems", [(2, 2, 1), (4, 2, 3), (5, 3, 2), (3, 4, 5)])
def test_multi_loop_sums_are_exact(nranks, nslots, slot_elems):
    count = 37
    values = {0: [[(7 * r + 3 * e) % 11 - 5 for e in range(count)] for r in range(nranks)]}
    sched = Schedule.from_orders([[0]] * nranks, counts=count)
    res = run_schedule(sched, "dfccl", nslots=nslots, slot_elems=slot_elems, values=values)
    assert res.outcome == COMPLETED
    want = [sum(values[0][r][e] for r in range(nranks)) for e in range(count)]
    assert res.values[0] == [want] * nranks


def test_one_slot_per_connector_is_refused():
    # with one slot, every rank holds a full outgoing slot and needs a free one to consume
    # its input: the ring itself deadlocks
    with pytest.raises(ValueError, match="nslots >= 2"):
        run_schedule(Schedule.from_orders([[0], [0]]), "dfccl", nslots=1)


def test_a_wrong_sum_is_reported_as_inexact():
    res = run_schedule(Schedule.from_orders([[0], [0]], counts=3), "dfccl")
    res.values[0][1][2] += 1
    assert not res.exact


def test_quitting_between_submissions_relaunches():
    policy = policies.get_policy("dfccl").with_params(QUIT_AFTER=1, BASE=2)
    sched = Schedule.from_orders([[0, 1, 2], [0, 1, 2]], counts=6)
    res = run_schedule(sched, policy, start_ticks=[0, 40], relaunch_ticks=3)
    assert res.outcome == COMPLETED and res.exact
    assert res.relaunches > 0


def test_runs_are_deterministic_and_seeds_matter():
    sched = Schedule.from_orders([[0, 1, "sync", 2], [2, 0, 1], [1, "sync", 2, 0]], counts=4,
                                 priorities={1: 1})
    a = run_schedule(sched, "dfccl", sim("dfccl"), seed=3)
    assert a == run_schedule(sched, "dfccl", sim("dfccl"), seed=3)
    ticks = {run_schedule(sched, "dfccl", sim("dfccl"), seed=s).ticks for s in range(8)}
    assert len(ticks) > 1


def test_schedule_json_format_and_round_trip():
    sched = Schedule(2, {0: Collective(1, 0), 5: Collective(4, 1)},
                     [[submit(0), SYNC, submit(5)], [submit(5), submit(0)]])
    data = json.loads(sched.to_json())
    assert data == {"nranks": 2,
                    "collectives": {"0": {"count": 1, "priority": 0},
                                    "5": {"count": 4, "priority": 1}},
                    "ranks": [[{"op": "submit", "coll": 0}, {"op": "sync"},
                               {"op": "submit", "coll": 5}],
                              [{"op": "submit", "coll": 5}, {"op": "submit", "coll": 0}]]}
    assert Schedule.from_json(sched.to_json()) == sched


@pytest.mark.parametrize("orders,message", [
    ([[0]], "at least 2 ranks"),
    ([[0], [0, 0]], "exactly once"),
    ([[0], [1]], "exactly once"),
    ([[0, "barrier"], [0]], "unknown op"),
])
def test_invalid_schedules_are_refused(orders, message):
    with pytest.raises(ValueError, match=message):
        Schedule.from_orders(orders)


def test_find_wait_cycle():
    assert find_wait_cycle({0: 1, 1: 2, 2: 0}) == [0, 1, 2]
    assert find_wait_cycle({2: 0, 0: 1, 1: 2}) == [0, 1, 2]
    assert find_wait_cycle({0: [1], 1: [], 2: [1]}) is None
    assert find_wait_cycle({5: [1], 1: [2, 3], 3: [5], 2: []}) == [1, 3, 5]
    assert find_wait_cycle({4: 4}) == [4]
    assert find_wait_cycle({}) is None


def test_a_long_head_budget_is_slow_progress_not_livelock():
    """A daemon asks should_quit only between passes, and a head budget of 500 ticks tried
    NUM_TRY (5) times spins 7,500 ticks a pass: the livelock horizon counts such passes
    (the property tests drew these two on CI, 2026-12-01: each was called a livelock at
    20,004 ticks, where the first completes and the second deadlocks on its wait_all
    cycle)."""
    def programs(*orders):
        return [[SYNC if c == "sync" else WAIT_ALL if c == "wait" else submit(c)
                 for c in order] for order in orders]

    colls = {c: Collective(1, 0) for c in range(3)}
    synced = Schedule(3, colls, programs([0, 1, 2], [0, 1, 2], [1, 2, "sync", 0]))
    waited = Schedule(3, colls, programs([0, 1, 2], [0, 1, "wait", 2], [1, 2, "wait", 0]))
    policy = policies.get_policy("dfccl").with_params(BASE=1, FACTOR=1, NUM_TRY=5,
                                                      HEAD_BASE=500, QUIT_AFTER=2)
    opts = dict(nslots=2, slot_elems=1, relaunch_ticks=1)
    done = run_schedule(synced, policy, **opts)
    assert done.outcome == COMPLETED and done.exact and done.ticks > 20_004, done.summary()
    stuck = run_schedule(waited, policy, **opts)
    assert stuck.outcome == DEADLOCK, stuck.summary()
    assert set(stuck.blocked.values()) == {"wait_all"}


def test_a_wait_before_its_submission_is_refused():
    with pytest.raises(ValueError, match="rank 0: wait of collective 0 before it submits"):
        Schedule(2, {0: Collective()}, [[wait(0), submit(0)], [submit(0)]])
    sched = Schedule(2, {0: Collective()}, [[submit(0), stream_wait(0), SYNC], [submit(0)]])
    assert Schedule.from_json(sched.to_json()) == sched


def _late_peer(first):
    """Rank 0 submits collective 0, then does ``first``; rank 1 submits it only after rank
    0's daemon has given up on it and quit (ten quit times later)."""
    quit_after = policies.get_policy("dfccl").values(model=True)["QUIT_AFTER"]
    sched = Schedule(2, {0: Collective()}, [[submit(0), *first, WAIT_ALL],
                                            [submit(0), WAIT_ALL]])
    return run_schedule(sched, "dfccl", start_ticks=[0, 10 * quit_after])


def test_a_stream_wait_before_a_device_sync_deadlocks_where_a_host_wait_completes():
    """Why pydfccl never makes a stream wait for a collective on the GPU. With ``wait`` the
    host waits; its daemon, stuck on the late peer, quits, is relaunched when the peer
    comes, and the run completes. With ``stream_wait`` the host goes on into a device sync
    that waits for the stream, which waits for the collective, which needs the daemon, whose
    relaunch the sync holds up: nothing can end it. The pattern stalled a 4-rank training
    job on an H200 (``torch.cuda.synchronize()`` behind a collective on torch's stream)."""
    host = _late_peer([wait(0), SYNC])
    assert host.outcome == COMPLETED and host.exact and host.relaunches >= 1
    stream = _late_peer([stream_wait(0), SYNC])
    assert stream.outcome == DEADLOCK and stream.blocked == {0: "sync", 1: "wait_all"}


def test_a_submission_behind_a_stream_wait_starts_only_once_the_stream_passes_it():
    """The stream gate: a run issued after a stream wait enters the queue when the stream
    has passed the wait. Two ranks that order two collectives behind each other's on their
    streams deadlock, as the same calls do under NCCL; issued with host waits after both
    submissions they complete."""
    colls = {0: Collective(), 1: Collective()}
    crossed = Schedule(2, colls, [[submit(0), stream_wait(0), submit(1), WAIT_ALL],
                                  [submit(1), stream_wait(1), submit(0), WAIT_ALL]])
    assert run_schedule(crossed, "dfccl").outcome != COMPLETED
    hosted = Schedule(2, colls, [[submit(0), submit(1), wait(0), wait(1)],
                                 [submit(1), submit(0), wait(1), wait(0)]])
    assert run_schedule(hosted, "dfccl").outcome == COMPLETED


def test_hypothesis_finds_programs_that_only_stream_waits_deadlock():
    """The model explores these programs: among small two-rank programs, search for one
    that completes when every wait is the host's and does not with GPU stream waits."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    quit_after = policies.get_policy("dfccl").values(model=True)["QUIT_AFTER"]

    @st.composite
    def programs(draw):
        ranks = []
        for _ in range(2):
            order = draw(st.permutations([0, 1]))
            program = []
            for c in order:
                program.append(submit(c))
                program += [wait(c)] * draw(st.booleans()) + [SYNC] * draw(st.booleans())
            ranks.append(program)
        return ranks, draw(st.sampled_from([0, 10 * quit_after]))

    def host_only_completes(drawn):
        ranks, late = drawn
        colls = {0: Collective(), 1: Collective()}
        as_stream = [[stream_wait(e.coll) if e.op == "wait" else e for e in p] for p in ranks]
        host = run_schedule(Schedule(2, colls, ranks), "dfccl", start_ticks=[0, late])
        stream = run_schedule(Schedule(2, colls, as_stream), "dfccl", start_ticks=[0, late])
        return host.outcome == COMPLETED and stream.outcome != COMPLETED

    found = hypothesis.find(programs(), host_only_completes,
                            settings=hypothesis.settings(max_examples=500, database=None,
                                                         deadline=None))
    ranks, late = found
    assert any(e.op == "wait" for p in ranks for e in p), found


@pytest.mark.parametrize("policy, zero", [("fixed", dict(THRESHOLD=0)), ("dfccl", dict(BASE=0)),
                                          ("patient_head", dict(BASE=0))])
@pytest.mark.parametrize("orders", [
    [[0, "sync", 1], [1, "sync", 0]],
    [[0, "sync", 1, 2], [2, 1, "sync", 0], [1, 2, 0]],
    [[0, 1], [1, 0]],
])
def test_zero_budgets_complete_as_the_engine_does(policy, zero, orders):
    """A budget of 0 still checks once, and the kernel's clock runs meanwhile: a stuck
    daemon's idle time grows until it quits, so the device syncs return (the engine quits
    and completes these; the model used to call them livelocks)."""
    sched = Schedule.from_orders(orders, counts=4)
    res = run_schedule(sched, policies.get_policy(policy).with_params(**zero))
    assert res.outcome == COMPLETED, res.summary()
    assert res.exact
    if any("sync" in order for order in orders):
        assert res.quits >= 2


def test_a_livelock_says_who_is_blocked_on_whom():
    never_quit = policies.get_policy("dfccl").with_params(QUIT_AFTER=1 << 60, BASE=10)
    res = run_schedule(SYNC_CYCLE, never_quit, max_quiet_ticks=20_000)
    assert res.outcome == LIVELOCK
    assert res.summary().endswith("; hosts blocked: rank 0 in sync, rank 1 in sync; "
                                  "collectives waiting: rank 0 in 0 on rank 1, "
                                  "rank 1 in 1 on rank 0")


SPLIT = [[1, 5, 0, 2], [2, 0, 3, 0], [4, 4, 4, 4], [0, 1, 0, 5]]   # SPLIT[a][b]: a sends b


def _split_schedule(orders):
    colls = {0: Collective.all_to_allv(SPLIT), 1: Collective(count=9)}
    return Schedule(4, colls, [[submit(c) for c in order] for order in orders])


@pytest.mark.parametrize("slot_elems", [1, 2, 5])
def test_all_to_allv_moves_each_block_to_its_rank(slot_elems):
    res = run_schedule(_split_schedule([[0, 1]] * 4), "nccl", slot_elems=slot_elems)
    assert res.outcome == COMPLETED and res.exact
    own = [[(r + 1) * (e + 1) for e in range(sum(SPLIT[r]))] for r in range(4)]
    # rank 2 gets rank 0's third block (after 1 + 5 elements: none), rank 1's (after 2 + 0:
    # 3 elements), its own third (after 8: 4 elements) and rank 3's (after 1 + 0: none)
    assert res.values[0][2] == own[1][2:5] + own[2][8:12] == res.wanted(0, 2)


def test_all_to_allv_in_disorder_is_preempted_not_deadlocked():
    sched = _split_schedule([[0, 1], [1, 0], [0, 1], [1, 0]])
    res = run_schedule(sched, "dfccl", params=sim("dfccl"), slot_elems=2)
    assert res.outcome == COMPLETED and res.exact and res.preemptions > 0
    stuck = run_schedule(sched, "nccl", slot_elems=2)
    assert stuck.outcome == DEADLOCK
    # an all_to_allv waits on any peer, not only the ring's neighbours
    assert {c for _, c, _ in stuck.cycle} == {0, 1}


def test_all_to_allv_schedules_round_trip_and_are_checked():
    sched = _split_schedule([[0, 1]] * 4)
    data = json.loads(sched.to_json())
    assert data["collectives"]["0"] == {"count": 5, "priority": 0, "kind": "all_to_allv",
                                        "counts": SPLIT}
    assert Schedule.from_json(sched.to_json()) == sched
    with pytest.raises(ValueError, match="counts= goes with kind all_to_allv"):
        Collective(count=3, counts=((1,),)).check(0, 1)
    with pytest.raises(ValueError, match="counts must be 2 rows of 2 counts in 0..3"):
        Collective(3, kind="all_to_allv", counts=((1, 4), (0, 0))).check(0, 2)
    with pytest.raises(ValueError, match="kind must be one of"):
        Collective(3, kind="gossip").check(0, 2)
