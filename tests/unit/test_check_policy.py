"""A policy checked for the device in seconds: its functions compiled with the daemon's
argument types (``check-policy``, and every communicator on the simulator), then a bounded
random trial in the model."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pydfccl.kernels.policy_types import PolicyTypeError, check_policy_types
from pydfccl.sched import Policy, get_policy, policy_names

REPO = Path(__file__).resolve().parents[2]

BAD = '''
from pydfccl.sched.policies import Param, Policy, get_policy

TABLE = {1: 5}


def on_load(params, is_head, try_count):
    budgets = {0: params[BASE], 1: 2 * params[BASE]}
    return budgets[is_head] * try_count


def on_load_global(params, is_head, try_count):
    return TABLE[1] * try_count


def on_load_float(params, is_head, try_count):
    return params[BASE] * 1.5


def on_load_ok(params, is_head, try_count):
    return params[BASE] * try_count


dfccl = get_policy("dfccl")
rest = (dfccl.threshold_after_wait, dfccl.tries_per_pass, dfccl.order_key, dfccl.should_quit)
table = dict(dfccl.parameters, BASE=Param.time(7_000))
with_dict = Policy("with_dict", on_load, *rest, parameters=table)
with_global = Policy("with_global", on_load_global, *rest, parameters=table)
with_float = Policy("with_float", on_load_float, *rest, parameters=table)
fine = Policy("fine", on_load_ok, *rest, parameters=table)
'''


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    (tmp_path / "badpolicies.py").write_text(BAD)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    return env, tmp_path


@pytest.mark.parametrize("name", policy_names())
def test_every_registered_policy_compiles_with_the_daemons_types(name):
    check_policy_types(get_policy(name))


@pytest.mark.parametrize("attr, line, why", [
    ("with_dict", 9, "builds a Python object (dict, list, set or string)"),
    ("with_global", 13, "reads the global TABLE, a dict"),
    ("with_float", 16, "returns float64, not an integer"),
])
def test_what_the_device_cannot_compile_is_refused_with_its_line(plugins, attr, line, why):
    with pytest.raises(PolicyTypeError) as info:
        check_policy_types(get_policy(f"badpolicies:{attr}"))
    message = str(info.value)
    assert message.startswith(f"policy '{attr}': threshold_on_load (")
    assert f"badpolicies.py:{line})" in message and why in message


def test_a_lambda_policy_is_checked_too():
    dfccl = get_policy("dfccl")
    policy = Policy("listy",
                    lambda params, is_head, try_count, priority, memo: len([1, 2]),
                    *dfccl.functions[1:], parameters=dict(dfccl.parameters))
    with pytest.raises(PolicyTypeError, match="builds a Python object"):
        check_policy_types(policy)


def test_a_passed_check_is_marked_and_not_compiled_again(plugins, tmp_path, monkeypatch):
    """A function that passed leaves a mark in the kernel cache; another process (here: the
    check without its in-process memo) finds it and compiles nothing. What fails, and what
    reads a global that is not a number, is never marked."""
    from pydfccl.kernels import policy_types

    monkeypatch.setenv("PYDFCCL_CACHE_DIR", str(tmp_path / "cache"))
    fine = get_policy("badpolicies:fine").functions[0]
    mark = policy_types._passed_mark(fine, "threshold_on_load")
    assert mark is not None and not mark.exists()
    policy_types.check_function.__wrapped__(fine, "threshold_on_load")
    assert mark.exists()

    def no_compile(fn, role):
        raise AssertionError("compiled although marked")

    with monkeypatch.context() as m:
        m.setattr(policy_types, "_compile_check", no_compile)
        policy_types.check_function.__wrapped__(fine, "threshold_on_load")

    with_dict = get_policy("badpolicies:with_dict").functions[0]
    with pytest.raises(PolicyTypeError):
        policy_types.check_function.__wrapped__(with_dict, "threshold_on_load")
    assert not policy_types._passed_mark(with_dict, "threshold_on_load").exists()
    with_global = get_policy("badpolicies:with_global").functions[0]
    assert policy_types._passed_mark(with_global, "threshold_on_load") is None


def _check(env, cwd, *args):
    before = os.times()
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pydfccl", "check-policy", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    after = os.times()
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    return done, cpu, time.perf_counter() - started


def test_check_policy_rejects_a_dict_in_seconds_and_passes_a_good_policy(plugins):
    env, cwd = plugins
    done, cpu, wall = _check(env, cwd, "badpolicies:with_dict")
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert line.startswith("check-policy badpolicies:with_dict: FAILED for the device: ")
    assert "badpolicies.py:9)" in line and "budgets[is_head] * try_count" in line
    # under 30 s of CPU (the wall clock of a loaded machine is not the command's)
    assert cpu < 30, (cpu, wall)

    done, _, _ = _check(env, cwd, "badpolicies:fine", "--examples", "40")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: its functions compile with the daemon's types" in done.stdout
    assert "40 random schedules complete with exact sums in the model" in done.stdout


def test_check_policy_writes_a_failing_schedule_that_replays_in_the_model(plugins):
    """A preemptive policy whose daemon never quits: a device sync behind it never
    returns, which the trial finds and writes as a counterexample file."""
    from pydfccl.sched.counterexample import load_counterexample

    env, cwd = plugins
    (cwd / "stubborn.py").write_text(
        "from pydfccl.sched.policies import Policy, get_policy\n"
        "d = get_policy('dfccl')\n"
        "def never(params, idle):\n    return 0\n"
        "stubborn = Policy('stubborn', *d.functions[:4], never, parameters=d.parameters)\n")
    done, _, _ = _check(env, cwd, "stubborn:stubborn", "--counterexample", "found.json")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED in the model: example " in done.stdout
    assert "python -m pydfccl replay found.json" in done.stdout
    found = load_counterexample(cwd / "found.json")
    assert found.policy == "stubborn:stubborn"
    assert found.model.split()[0] in ("deadlock", "livelock")
    assert found.run_model().summary() == found.model          # it replays as written
    assert any(ev.op == "sync" for program in found.schedule.ranks for ev in program)


def test_check_policy_names_a_bad_argument_in_one_line(plugins):
    env, cwd = plugins
    done, _, _ = _check(env, cwd, "badpolicies:nope")
    assert done.returncode == 2
    assert "module badpolicies has no attribute 'nope'" in done.stderr
    done, _, _ = _check(env, cwd, "dfccl", "--param", "NOPE=1")
    assert done.returncode == 2 and "has no parameter(s) ['NOPE']" in done.stderr


def test_the_simulator_refuses_such_a_policy_when_a_communicator_starts(plugins):
    env, cwd = plugins
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pydfccl", "demo", "-n", "2", "-k", "2",
                           "-i", "1", "-c", "4", "--policy", "badpolicies:with_dict"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    assert done.returncode != 0
    assert "PolicyTypeError: policy 'with_dict': threshold_on_load" in done.stderr
    assert "badpolicies.py:9)" in done.stderr
    assert time.perf_counter() - started < 300     # refused at start, no watchdog wait
