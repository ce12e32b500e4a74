"""``python -m pydfccl teach`` as a teacher runs it, and the pictures it shares with the
demo: written when a run completes and when it deadlocks."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"


def _python(*args, cwd, timeout=600):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "pydfccl", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_teach_narrates_the_deadlock_and_dfccl_and_writes_its_pictures(tmp_path):
    done = _python("teach", "--out", "pictures", cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # each rank's submission order first, before anything runs
    first_run = out.index("== NCCL-style")
    assert out.index("iteration 1, rank 0: all_reduce 0, all_reduce 1") < first_run
    assert out.index("iteration 1, rank 1: all_reduce 1, all_reduce 0") < first_run
    baseline, ours = out[first_run:].split("== dfccl", 1)
    # the baseline: progress while the watchdog waits, the report once, with its cycle
    assert "no progress on any rank for 1 s" in baseline
    assert out.count("wait-for cycle: rank 0 -> rank 1 -> rank 0") == 1
    assert "a cycle: rank 0 -> rank 1 -> rank 0" in baseline
    # dfccl: preemptions, resumes, quits and relaunches, as they happen
    for said in ("preempted, its context saved", "resumes all_reduce", "quits",
                 "relaunched", "device sync returned", "completed: 2 iterations"):
        assert said in ours, said
    assert "DEADLOCK" not in ours
    # a line each, whichever rank's thread printed it; a launch once, not once a block
    assert all(line.count(" ms  ") <= 1 for line in out.splitlines()), out
    launches = [int(n) for n in re.findall(r"relaunched \(launch (\d+)\)", ours)]
    relaunches = int(re.search(r"(\d+) relaunches", ours).group(1))
    assert max(launches) - 1 <= relaunches, (launches, relaunches)
    for name in ("baseline-wait-for", "baseline-timeline", "dfccl-wait-for", "dfccl-timeline"):
        assert (tmp_path / "pictures" / f"{name}.png").read_bytes()[:8] == PNG, name


def test_demo_draws_its_timeline_and_the_wait_for_graph_when_it_deadlocks(tmp_path):
    done = _python("demo", "-n", "2", "-k", "2", "-i", "1", "-c", "16", "--policy", "nccl",
                   "--watchdog", "3", "--no-progress", "--plot", "t.png", cwd=tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "FAILED: DeadlockError" in done.stderr and "wait-for cycle" in done.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG
    assert (tmp_path / "t-wait-for.png").read_bytes()[:8] == PNG


def test_status_every_prints_on_a_short_run_in_a_users_words(tmp_path):
    done = _python("demo", "-n", "2", "-k", "2", "-i", "1", "-c", "16", "--no-progress",
                   "--status-every", "60", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    err = done.stderr
    assert "status (rank 0 done):" in err
    # rank 0 done: rank 1's data has moved, but on a loaded machine its host may not yet
    # have taken either of its 2 completions from its queue
    assert "rank 0: 0 outstanding" in err and re.search(r"rank 1: [0-2] outstanding", err)
    for internal in ("launch_log", "daemon launches", "for_s", "loop "):
        assert internal not in err, internal


def test_an_unfinished_stretch_is_drawn_as_such(tmp_path):
    from pydfccl.cli.pictures import draw_timeline, draw_wait_graph, stretches

    events = [dict(t_ns=t, rank=r, block=0, event=what, coll=c, loop=0, step=0, **extra)
              for t, r, what, c, extra in [
                  (0, 0, "loaded", 0, {}), (5_000_000, 0, "preempted", 0, dict(waited_ns=2e6)),
                  (6_000_000, 0, "loaded", 1, {}), (9_000_000, 0, "completed", 1, {}),
                  (1_000_000, 1, "loaded", 1, {}), (9_500_000, 1, "quit", None, {})]]
    got = {(s["rank"], s["coll"]): s["ended"] for s in stretches(events)}
    assert got == {(0, 0): "preempted", (0, 1): "completed", (1, 1): "quit"}
    draw_timeline(events, str(tmp_path / "t.png"), "a test", {0: "A", 1: "B"})
    draw_wait_graph([(0, 1, "A"), (1, 2, "B"), (2, 0, "A")], str(tmp_path / "g.png"),
                    "three ranks", cycle=[0, 1, 2])
    assert (tmp_path / "t.png").read_bytes()[:8] == PNG
    assert (tmp_path / "g.png").read_bytes()[:8] == PNG


def test_teach_names_a_bad_option(capsys):
    from pydfccl import cli

    assert cli.main(["teach", "-i", "1"]) == 2
    assert "--iters must be at least 2" in capsys.readouterr().err
    assert cli.main(["teach", "--watchdog", "0"]) == 2
    assert "--watchdog must be positive" in capsys.readouterr().err
