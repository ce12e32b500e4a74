"""The engine agrees with the model: small random schedules replayed on the CUDA simulator.

Each example launches real rank processes (a few seconds each), so the example budgets are
small and fixed here, whatever the profile. The oracle is the model itself
(``pydfccl.cli.replay.predict``: the same schedule, policy, slot sizes and inputs):

- dfccl: schedules without ``wait_all`` cycles (a ``wait_all`` only at the end) always
  complete in the model; the engine must complete them too, with every rank holding exactly
  the model's sums.
- nccl: the engine deadlocks (watchdog report) exactly when the model does, and completes
  in the model's completion order otherwise. Device syncs come only before a rank's first
  submission here: a sync after it is a deadlock in the model (the daemon never quits), and
  the engine's sync blocks for ever too, but once that rank's collectives have completed
  nothing is outstanding there, and the watchdog, which only watches outstanding work,
  never reports it: the launch hangs (``[[0, "sync", 1], [0, "sync", 1]]`` under nccl).
"""

import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

from collective_draws import drawn_collectives
from policy_choice import chosen, only
from pydfccl.cli.replay import EXIT_COMPLETED, EXIT_DEADLOCK, predict, replay
from pydfccl.sched.model import COMPLETED, DEADLOCK, SYNC, WAIT_ALL, Schedule, submit

NCCL_WATCHDOG = 3.0     # seconds without progress before nccl's deadlock is reported
# (only a wait-for cycle among daemons that never preempt is reported as a deadlock: a
# slow rank is not one; the docs' nccl demos use 3 s too)
VERDICT_WATCHDOG = 30.0  # the verdict test's, for every policy: room for late peers
LAUNCH_TIMEOUT = 180.0  # a hang fails the example instead of the whole run

# Every example is a launch (seconds): few of them, more under the deep profile, and no
# shrinking (each step would be another launch; the raw examples are small already).
EXAMPLES = 25 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 5
engine_settings = settings(max_examples=EXAMPLES, deadline=None, print_blob=True,
                           phases=[Phase.explicit, Phase.reuse, Phase.generate],
                           suppress_health_check=[HealthCheck.too_slow])


@st.composite
def small_schedules(draw, sync_anywhere=True):
    """2-3 ranks, 2-3 collectives: all-reduces of 1..40 elements, or all_to_allvs of 0..40
    elements a pair; each rank keeps the common order or permutes it, may sync before any
    submission (``sync_anywhere=False``: only before its first) and may end with a sync or a
    wait_all. Shrinks towards all-reduces, agreeing ranks, no syncs."""
    nranks = draw(st.integers(2, 3))
    ncolls = draw(st.integers(2, 3))
    counts = draw(st.lists(st.integers(1, 40), min_size=ncolls, max_size=ncolls))
    prios = draw(st.lists(st.integers(0, 1), min_size=ncolls, max_size=ncolls))
    row = st.lists(st.integers(0, 40), min_size=nranks, max_size=nranks)
    splits = draw(st.lists(st.none() | st.lists(row, min_size=nranks, max_size=nranks),
                           min_size=ncolls, max_size=ncolls))
    common = list(range(ncolls))
    ranks = []
    for _ in range(nranks):
        order = draw(st.permutations(common)) if draw(st.booleans()) else common
        program = []
        for i, c in enumerate(order):
            if (sync_anywhere or i == 0) and draw(st.booleans()):
                program.append(SYNC)
            program.append(submit(c))
        tail = draw(st.sampled_from(["none", "wait_all", "sync"] if sync_anywhere
                                    else ["none", "wait_all"]))
        if tail != "none":
            program.append(WAIT_ALL if tail == "wait_all" else SYNC)
        ranks.append(program)
    return Schedule(nranks, drawn_collectives(counts, prios, splits), ranks)


PREEMPTIVE = chosen(["dfccl"], preemptive=True)   # or the one --policy names


@pytest.mark.skipif(not PREEMPTIVE, reason="the policy named by --policy is not preemptive")
@engine_settings
@given(schedule=small_schedules(), dtype=st.sampled_from(["float32", "int64"]))
def test_dfccl_completes_with_the_models_sums(schedule, dtype):
    note(schedule.to_json())
    policy = PREEMPTIVE[0]
    model = predict(schedule, policy, dtype)
    assert model.outcome == COMPLETED, model.summary()   # no wait_all cycle by construction
    out = replay(schedule, policy, dtype=dtype, timeout=LAUNCH_TIMEOUT)
    assert out["outcome"] == "completed", out.get("report")
    for r, rank in enumerate(out["ranks"]):
        assert rank["verified"] == len(schedule.collectives)
        assert rank["stats"]["completed"] == len(schedule.collectives)
        assert sorted(rank["completion_order"]) == sorted(schedule.collectives)
        for c in schedule.collectives:
            assert rank["outputs"][c] == model.values[c][r] == model.wanted(c, r), (r, c)


@pytest.mark.skipif(not only("nccl"), reason="another policy was named")
@engine_settings
@given(schedule=small_schedules(sync_anywhere=False))
def test_nccl_deadlocks_exactly_when_the_model_does(schedule):
    note(schedule.to_json())
    model = predict(schedule, "nccl")
    note(f"model: {model.summary()}")
    out = replay(schedule, "nccl", watchdog_timeout=NCCL_WATCHDOG, timeout=LAUNCH_TIMEOUT)
    note(f"engine: {out['outcome']}")
    event(f"model: {model.outcome}")
    assert out["outcome"] == model.outcome
    if model.outcome == COMPLETED:
        # no preemption, submission order: the k-th completion is the k-th submission
        assert out["completion_order"] == model.completion_order == schedule.orders()
        assert all(s["preemptions"] == 0 for s in out["stats"])
    else:
        assert model.outcome == DEADLOCK and model.cycle
        assert out["report"].startswith("deadlock: a wait-for cycle"), out["report"]
        assert "no progress on any rank" in out["report"], out["report"]
        assert "wait-for cycle: rank" in out["report"], out["report"]


VERDICT_POLICIES = chosen(["dfccl", "fixed"], preemptive=True)


@st.composite
def budgets(draw, name):
    """The policy with its budget left, or set to 0 (one check, then preemption: the case
    where the model once said livelock and the engine completed)."""
    from pydfccl.sched.policies import get_policy

    policy = get_policy(name)
    budget = next((p for p in ("BASE", "THRESHOLD") if p in policy.parameters), None)
    if budget is not None and draw(st.booleans(), label=f"{budget}=0"):
        policy = policy.with_params(**{budget: 0})
    return policy


@pytest.mark.skipif(not VERDICT_POLICIES, reason="the policy named by --policy is not "
                                                 "preemptive")
@settings(engine_settings, max_examples=3 if EXAMPLES == 5 else 15)
@given(data=st.data(), schedule=small_schedules(), name=st.sampled_from(VERDICT_POLICIES
                                                                        or ["dfccl"]))
def test_the_model_and_the_engine_give_the_same_verdict(data, schedule, name):
    """Whatever the model says (completed, deadlock, livelock), the engine says the same,
    for preemptive policies with their own budgets or none."""
    policy = data.draw(budgets(name), label="policy")
    note(schedule.to_json())
    model = predict(schedule, policy)
    note(f"model: {model.summary()}")
    out = replay(schedule, policy, watchdog_timeout=VERDICT_WATCHDOG, timeout=LAUNCH_TIMEOUT)
    note(f"engine: {out['outcome']}")
    event(f"model: {model.outcome}")
    assert out["outcome"] == model.outcome, (model.summary(), out.get("report"))


def _demo(path, *extra):
    return subprocess.run([sys.executable, "-m", "pydfccl", "demo", "--schedule", str(path),
                           *extra], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT)


@pytest.mark.skipif(not only("dfccl"), reason="another policy was named")
def test_schedule_file_replays_from_the_command_line(tmp_path):
    opposite = Schedule.from_orders([[0, 1], [1, 0]], counts={0: 3, 1: 17})
    path = tmp_path / "opposite.json"
    path.write_text(opposite.to_json())
    assert Schedule.from_json(path.read_text()) == opposite

    done = _demo(path)
    assert done.returncode == EXIT_COMPLETED, done.stdout + done.stderr
    assert "completed" in done.stdout and "4 results verified" in done.stdout
    assert "model (dfccl): completed" in done.stdout

    stuck = _demo(path, "--policy", "nccl", "--watchdog", str(NCCL_WATCHDOG))
    assert stuck.returncode == EXIT_DEADLOCK, stuck.stdout + stuck.stderr
    assert "DEADLOCK" in stuck.stdout
    assert "model (nccl): deadlock" in stuck.stdout
