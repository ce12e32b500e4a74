"""Short soak and fault cases: extreme budgets, more runs than the queue holds, steady
resources over many collectives (the long forms run on a GPU)."""

import re

import pytest

import pydfccl
from pydfccl.protocol import layout as L
import rank_workers
import shared_workers

NEVER_QUICK = 10**15   # ns: a budget no wait here reaches


@pytest.mark.parametrize("policy, rotate", [
    (pydfccl.get_policy("fixed").with_params(THRESHOLD=1), True),     # preempt at every miss
    (pydfccl.get_policy("dfccl").with_params(BASE=1, FACTOR=1), True),
    (pydfccl.get_policy("dfccl").with_params(BASE=NEVER_QUICK), False),   # never preempt
], ids=["fixed-1ns", "dfccl-1ns", "dfccl-huge"])
def test_extreme_budgets_still_complete_exactly(policy, rotate):
    """Budgets at both ends keep results exact (no overflow, no lost step). A daemon that
    never preempts is the nccl policy: with the ranks in disorder it deadlocks whenever a
    rank's daemon starts on its first submission before the others reach its SQ (a loaded
    machine), so that case submits in order."""
    ncolls, count = 3, 200
    per_rank = pydfccl.launch(rank_workers.opposite_orders, 2, args=(ncolls, count, rotate),
                              policy=policy, timeout=300)
    for out in per_rank:
        for k in range(ncolls):
            want = sum(shared_workers.rank_inputs(r, count, "int64", k) for r in range(2))
            assert out["results"][k] == want.tolist()


def test_more_runs_than_the_queue_holds_are_queued_not_dropped():
    runs = 300   # far more than RUNS_IN_FLIGHT: the host holds the rest back
    per_rank = pydfccl.launch(rank_workers.many_runs_without_waiting, 2, args=(runs,), timeout=600)
    for out in per_rank:
        assert out["results"] == [2 * i + 1 for i in range(runs)]
        assert out["order"] == list(range(runs))
        assert out["stats"]["completed"] == runs
        # the first RUNS_IN_FLIGHT runs went to the SQ at once, the rest as runs completed
        assert out["submitted_at_once"] >= L.RUNS_IN_FLIGHT


def test_threads_and_launches_stay_bounded():
    (out,) = pydfccl.launch(rank_workers.steady_resources, 1, args=(400,), timeout=300)
    assert len(set(out["threads"])) == 1, out["threads"]
    assert max(out["block_threads"]) <= 1, out["block_threads"]    # one daemon block at most
    # Once warm, 300 more collectives leave the heap as it was: no per-run residue.
    first, last = out["objects"][1], out["objects"][-1]
    assert last - first < 200, out["objects"]
    assert out["stats"]["completed"] == 400
    assert out["stats"]["launches"] <= 400


def _soak_summary(out: str) -> tuple:
    """(submitted, completed, lost, verified, wrong) from the soak's summary."""
    runs = re.search(r"runs: (\d+) submitted on all ranks, (\d+) completed, (\d+) lost; "
                     r"outputs verified: (\d+) .*, wrong: (\d+)", out)
    assert runs, out
    return tuple(map(int, runs.groups()))


def test_soak_for_some_seconds_as_a_user_types_it():
    """``python -m pydfccl soak --seconds 5``, exactly: its progress bar has no total (no
    schedule count), which crashed the command after its first schedule."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pydfccl", "soak", "--seconds", "5"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "pydfccl soak on the " in done.stdout and ": 5 s, 2.." in done.stdout
    assert re.search(r"soak on the .*: \d+ schedules? \(seed 0, policy dfccl\) in ",
                     done.stdout), done.stdout
    submitted, completed, lost, verified, wrong = _soak_summary(done.stdout)
    assert submitted == completed > 0 and lost == 0 and wrong == 0 and verified > 0
    assert "OK: every output verified, nothing lost" in done.stdout
    assert "schedule/s" in done.stderr or "schedule [" in done.stderr     # the bar ran


def test_soak_names_a_bad_argument_in_one_line_and_exits_2(capsys):
    from pydfccl import cli

    for argv, message in ((["--max-ranks", "1"], "--max-ranks must be at least 2"),
                          (["--seconds", "0"], "--seconds must be more than 0"),
                          (["--param", "NOPE=1"], "--param policy 'dfccl' has no parameter")):
        assert cli.main(["soak"] + argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m pydfccl soak: error: " + message), err
        assert err.count("\n") == 1


def test_soak_passes_the_policy_the_parser_built_down_to_launch(monkeypatch, capsys):
    from pydfccl import cli
    from pydfccl.cli import soak, soak_run

    built, launched = [], []
    real = soak.chosen_policy

    def chosen_policy(args):
        built.append(real(args))
        return built[-1]

    def launch(worker, nranks, *, policy, **kw):
        launched.append(policy)
        stats = dict(completed=1, preemptions=0, relaunches=0, dropped_buffers=0)
        return [dict(rank=r, submitted=1, verified=1, wrong=[], stats=stats)
                for r in range(nranks)]

    monkeypatch.setattr(soak, "chosen_policy", chosen_policy)
    monkeypatch.setattr(soak_run, "launch", launch)
    assert cli.main(["soak", "-s", "2", "--param", "BASE=9"]) == 0
    ((policy, overrides),) = built
    assert launched == [policy, policy] and all(p is policy for p in launched)
    assert policy.params["BASE"] == 9 and overrides == {"BASE": 9}
    assert "policy dfccl BASE=9" in capsys.readouterr().out


def test_soak_command_short_form(capsys):
    """As a user runs it: through the dispatch, with the progress bar on (on stderr: the
    soak draws it in this process; the summary on stdout still parses)."""
    from pydfccl import cli

    code = cli.main(["soak", "--schedules", "3", "--max-ranks", "3", "--max-count", "40",
                     "--max-colls", "3"])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, out + captured.err
    assert "soak: 100%" in captured.err and "3/3" in captured.err      # the bar ran
    submitted, completed, lost, verified, wrong = _soak_summary(out)
    assert submitted == completed > 0 and lost == 0 and wrong == 0 and verified > 0
    assert "3 schedules" in out and "resources of this process" in out
    table = out.split("resources of this process:\n", 1)[1].splitlines()
    assert table[0].split() == ["when", "threads", "RSS", "MiB", "objects", "GPU", "MiB",
                                "layouts"]
    assert table[1].startswith("  at the start")
    assert any(line.startswith("  at the end") for line in table[2:])
    growth = re.search(r"from the first schedule to the end: threads (\d+) -> (\d+), objects "
                       r"(\d+) -> (\d+)", out)
    assert growth, out
    threads_first, threads_last = int(growth[1]), int(growth[2])
    assert threads_first == threads_last, out
    assert "OK: every output verified, nothing lost" in out


def test_soak_schedules_are_reproducible_and_cover_the_engine():
    from pydfccl.protocol.codes import COLLECTIVE_KINDS as KINDS, DTYPES, OPS
    from pydfccl.cli.soak import SoakOptions, draw_schedule

    opts = SoakOptions(max_ranks=4, max_count=300, max_colls=6)
    schedules = [draw_schedule(7, i, opts, simulator=True) for i in range(60)]
    assert schedules[5] == draw_schedule(7, 5, opts, simulator=True)
    colls = [c for s in schedules for c in s.colls]
    assert {c.kind for c in colls} == set(KINDS)
    assert {c.op for c in colls} == set(OPS)
    assert {c.dtype for c in colls} == set(DTYPES)
    counts = {c.count for c in colls}
    assert 1 in counts and 63 in counts and 65 in counts     # a float32 slot is 64 elements
    assert {s.nranks for s in schedules} == {2, 3, 4}
    assert any(s.syncs[r] for s in schedules for r in range(s.nranks))
    assert any(len(set(s.orders)) > 1 for s in schedules)       # ranks disagree on order
    for s in schedules:
        for order in s.orders:
            assert sorted(order) == sorted(c for c, coll in enumerate(s.colls)
                                           for _ in range(coll.runs))


def test_soak_verdict_names_what_went_wrong():
    from pydfccl.cli.soak import SoakReport

    assert SoakReport(schedules=2, submitted=8, completed=8).verdict() is None
    bad = SoakReport(schedules=2, submitted=8, completed=7, wrong=["x"]).verdict()
    assert "1 wrong results" in bad and "1 runs lost" in bad
    failed = SoakReport(failures=["schedule 4: ..."], bad_schedules=[4]).verdict()
    assert failed == "schedule 4 failed"
    assert SoakReport().verdict() == "no schedule ran"


def test_resource_samples_name_what_grew_and_which_module_made_new_classes():
    from pydfccl.cli.soak import grown_types, resource_sample

    class Marker:
        pass

    first = resource_sample("before")
    kept = [type(f"Made{i}", (), {}) for i in range(50)] + [Marker() for _ in range(300)]
    last = resource_sample("after")
    grown = grown_types(first, last, top=8)
    assert "Marker +300" in grown and f"type ({__name__}) +50" in grown, grown
    assert grown_types(first, last, classes=True) == f"type ({__name__}) +50"
    assert len(kept) == 350
