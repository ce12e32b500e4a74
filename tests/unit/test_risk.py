"""Tests of the deadlock-risk study (pydfccl.sched.risk)."""

import csv
import time

import numpy as np
import pytest

from pydfccl.sched.risk import (PRESETS, Topology, find_deadlock, main, make_round,
                                risk_study, sample_round, simulate_round, wilson_interval)

PAIR = Topology(tp=1, dp=2, pp=1, colls_tp=0, colls_dp=2)  # two GPUs, one DP group


def test_hand_made_round_deadlocks():
    # GPU 0 defers DP collective 0 (issues 1 first) and syncs before issuing 0; GPU 1 issues
    # 0 and syncs. GPU 0 waits for 1, which GPU 1 has not issued; GPU 1 waits for 0.
    rnd = make_round(PAIR, skips=[[0], []], syncs=[[1], [1]])
    assert simulate_round(PAIR, rnd)
    assert sorted(find_deadlock(PAIR, rnd)) == [(0, 1), (1, 1)]


@pytest.mark.parametrize("skips,syncs", [
    ([[0], []], [[1], []]),        # GPU 1 never blocks: it issues 1 and GPU 0 can go on
    ([[0], []], [[], [1]]),        # GPU 0 never blocks
    ([[], []], [[1], [1]]),        # no disorder
    ([[0], [0]], [[1], [1]]),      # both defer the same collective: they still agree
    ([[0], []], [[0], [0]]),       # syncs before anything was issued wait for nothing
])
def test_hand_made_rounds_without_deadlock(skips, syncs):
    rnd = make_round(PAIR, skips, syncs)
    assert not simulate_round(PAIR, rnd)
    assert find_deadlock(PAIR, rnd) is None


def test_a_cycle_through_three_gpus_and_two_kinds_of_group():
    # tp=2, dp=2: GPUs 0,1 share a TP group, 0,2 a DP group, 1,3 and 2,3 the others.
    topo = Topology(tp=2, dp=2, pp=1, colls_tp=3, colls_dp=3)
    rng = np.random.default_rng(7)
    found = 0
    for _ in range(3000):
        rnd = sample_round(topo, 0.3, 0.3, rng)
        cycle = find_deadlock(topo, rnd)
        assert (cycle is not None) == simulate_round(topo, rnd)
        if cycle and len({g for g, _ in cycle}) >= 3:
            found += 1
    assert found > 0


@pytest.mark.parametrize("topo", [
    Topology(tp=2, dp=2, pp=2, colls_tp=6, colls_dp=6),
    Topology(tp=2, dp=3, pp=1, colls_tp=4, colls_dp=5),
    Topology(tp=3, dp=2, pp=3, colls_tp=3, colls_dp=4, colls_pp=2),
    Topology(tp=1, dp=4, pp=1, colls_tp=0, colls_dp=7),
])
def test_fast_characterization_matches_event_simulation(topo):
    rng = np.random.default_rng(topo.ngpus)
    deadlocks = 0
    for p, q in [(0.05, 0.2), (0.2, 0.2), (0.5, 0.5), (0.2, 0.05)]:
        for _ in range(120):
            rnd = sample_round(topo, p, q, rng)
            slow = simulate_round(topo, rnd)
            assert (find_deadlock(topo, rnd) is not None) == slow, (p, q, rnd)
            deadlocks += slow
    assert 0 < deadlocks < 480


@pytest.mark.parametrize("p,q", [(0.0, 0.3), (0.3, 0.0)])
def test_no_disorder_or_no_sync_never_deadlocks(p, q):
    rows = risk_study(PRESETS["small"]["topology"], [p], [q], rounds=300, seed=1)
    assert rows[0].deadlocks == 0


def test_small_preset_is_fast_and_reproducible():
    topo = PRESETS["small"]["topology"]
    start = time.perf_counter()
    rows = risk_study(topo, [0.05, 0.2], [0.2], rounds=500, seed=3)
    assert time.perf_counter() - start < 10
    assert [r.p for r in rows] == [0.05, 0.2]
    assert 0 < rows[0].deadlocks < rows[1].deadlocks < 500
    assert risk_study(topo, [0.2], [0.2], rounds=500, seed=3)[0] == rows[1]


def test_workers_do_not_change_results():
    topo = PRESETS["small"]["topology"]
    one = risk_study(topo, [0.1], [0.1, 0.3], rounds=250, seed=5, workers=1)
    two = risk_study(topo, [0.1], [0.1, 0.3], rounds=250, seed=5, workers=2)
    assert one == two


def test_wilson_interval():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    assert wilson_interval(0, 100) == (0.0, pytest.approx(0.0370, abs=1e-4))
    assert wilson_interval(100, 100)[1] == 1.0


def test_cli_writes_csv(tmp_path, capsys):
    out_csv = tmp_path / "risk.csv"
    code = main(["--preset", "small", "--rounds", "100", "--p", "0.1,0.2", "--q", "0.2",
                 "--csv", str(out_csv)])
    assert code == 0
    text = capsys.readouterr().out
    assert "95% CI" in text and "0.2" in text
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["p"], r["q"], r["rounds"]) for r in rows] == [("0.1", "0.2", "100"),
                                                             ("0.2", "0.2", "100")]
    assert 0 <= int(rows[0]["deadlocks"]) <= 100


def test_cli_writes_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out_png = tmp_path / "risk.png"
    assert main(["--rounds", "50", "--p", "0.1,0.2", "--q", "0.1,0.2",
                 "--plot", str(out_png)]) == 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--p", "1.5"])
    assert exc.value.code == 2
    assert main(["--tp", "0"]) == 2
    assert "tp, dp and pp must be >= 1" in capsys.readouterr().err


def test_a_skip_of_several_positions_defers_its_collective_that_far():
    topo = Topology(tp=1, dp=2, pp=1, colls_tp=0, colls_dp=6)
    rng = np.random.default_rng(0)
    rnd = sample_round(topo, 0.2, 0.0, rng, skip_span=3)
    skips = rnd.skips.tolist()
    assert skips == sorted(set(skips))
    assert all(s // 6 == (s + 1) // 6 or s % 6 == 5 for s in skips)
    with pytest.raises(ValueError, match="skip_span"):
        sample_round(topo, 0.2, 0.2, rng, skip_span=0)
    # one hand-checked draw: GPU 0 defers slot 1 past three submissions
    spread = make_round(topo, skips=[[1, 2, 3], []], syncs=[[], []])
    from pydfccl.sched.risk_rounds import Runs
    steps = Runs(spread.skips, 6).issue_steps(np.arange(6))
    assert steps.tolist() == [0, 4, 1, 2, 3, 5]


def test_multi_position_skips_keep_the_search_exact():
    topo = Topology(tp=2, dp=2, pp=2, colls_tp=4, colls_dp=4)
    rng = np.random.default_rng(11)
    deadlocks = 0
    for _ in range(300):
        rnd = sample_round(topo, 0.1, 0.3, rng, skip_span=3)
        slow = simulate_round(topo, rnd)
        assert (find_deadlock(topo, rnd) is not None) == slow
        deadlocks += slow
    assert deadlocks > 0


def test_risk_example_tells_one_deadlocked_round_as_a_cycle(capsys):
    assert main(["--example"]) == 0
    out = capsys.readouterr().out
    assert "deadlocks:" in out and "The wait-for cycle" in out
    assert "every sync waits for the next, and none returns" in out
    assert "waits for" in out and "issues only at step" in out
    assert main(["--example", "--skip-span", "3", "--p", "0.05", "--q", "0.05"]) == 0
    assert "past 3 submissions" in capsys.readouterr().out
