"""``python -m pydfccl replay FILE``: a counterexample file (schedule, policy of one's own,
parameters, options, seed) in the model and on the engine, both verdicts side by side, as
a user runs it; and ``demo --schedule FILE --param``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pydfccl.sched import Schedule
from pydfccl.sched.counterexample import Counterexample, load_counterexample

REPO = Path(__file__).resolve().parents[2]

PLUGIN = '''
from pydfccl.sched.policies import Param, Policy, get_policy


def on_load(params, is_head, try_count):
    return params[BASE] * try_count


d = get_policy("dfccl")
halving = Policy("halving", on_load, *d.functions[1:],
                 parameters=dict(d.parameters, BASE=Param.time(7_000)))
'''


@pytest.fixture
def user(tmp_path):
    (tmp_path / "mypolicies.py").write_text(PLUGIN)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    return env, tmp_path


def _pydfccl(env, cwd, *args):
    return subprocess.run([sys.executable, "-m", "pydfccl", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def test_a_file_carries_everything_and_round_trips(tmp_path):
    found = Counterexample(Schedule.from_orders([[0, "sync", 1], [1, 0]], counts=4),
                           "mypolicies:halving", {"BASE": 3}, {"seed": 5, "nslots": 2},
                           seed=11, model="completed after 1 ticks")
    path = tmp_path / "ce.json"
    found.save(path)
    assert load_counterexample(path) == found
    bare = tmp_path / "bare.json"
    bare.write_text(found.schedule.to_json())
    assert load_counterexample(bare).schedule == found.schedule
    with pytest.raises(ValueError, match="unknown run option"):
        Counterexample(found.schedule, options={"slots": 2})


def test_replay_runs_the_file_with_its_parameters_in_model_and_engine(user):
    env, cwd = user
    (cwd / "found.json").write_text(Counterexample(
        Schedule.from_orders([[0, "sync", 1], [1, 0]], counts=4), "mypolicies:halving",
        {"BASE": 3}, {"seed": 5, "nslots": 2}, seed=0).to_json())
    done = _pydfccl(env, cwd, "replay", "found.json", "--param", "QUIT_AFTER=50")
    assert done.returncode == 0, done.stdout + done.stderr
    head, as_found, at_engine_slots, engine, verdict = done.stdout.splitlines()
    assert head == ("replay found.json: 2 ranks, 2 all-reduces of float32, policy "
                    "mypolicies:halving BASE=3 QUIT_AFTER=50, found with seed 0")
    assert as_found.split(":", 1)[1].strip().startswith("completed after ")
    assert at_engine_slots.split(":", 1)[1].strip().startswith("completed after ")
    assert engine.startswith("  engine (CUDA simulator):") and "4 results verified" in engine
    assert verdict == "verdicts agree: completed"

    # demo --schedule takes the same file and --param
    done = _pydfccl(env, cwd, "demo", "--schedule", "found.json", "--policy",
                    "mypolicies:halving", "--param", "QUIT_AFTER=50")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "model (mypolicies:halving): completed" in done.stdout


def test_replay_flags_a_disagreement_with_its_exit_status(user):
    """A model allowed one quiet tick calls the run a livelock; the engine completes it."""
    env, cwd = user
    (cwd / "strict.json").write_text(Counterexample(
        Schedule.from_orders([[0, "sync", 1], [1, 0]], counts=4), "dfccl",
        options={"max_quiet_ticks": 1}).to_json())
    done = _pydfccl(env, cwd, "replay", "strict.json")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "livelock" in done.stdout
    assert done.stdout.splitlines()[-1] == ("verdicts DISAGREE: the model says livelock, "
                                            "the engine completed")


def test_replay_of_a_deadlock_both_see_exits_3(user):
    env, cwd = user
    (cwd / "opposite.json").write_text(Counterexample(
        Schedule.from_orders([[0, 1], [1, 0]], counts={0: 3, 1: 17}), "nccl").to_json())
    done = _pydfccl(env, cwd, "replay", "opposite.json", "--watchdog", "6")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "DEADLOCK" in done.stdout
    assert done.stdout.splitlines()[-1] == "verdicts agree: deadlock"


def test_replay_names_a_bad_file_in_one_line(user):
    env, cwd = user
    (cwd / "junk.json").write_text('{"nranks": 2}')
    done = _pydfccl(env, cwd, "replay", "junk.json")
    assert done.returncode == 2 and "junk.json: not a counterexample" in done.stderr
    done = _pydfccl(env, cwd, "replay", "missing.json")
    assert done.returncode == 2 and "missing.json" in done.stderr
