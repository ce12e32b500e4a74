"""The scripts in ``scripts/`` work: each is documented in ``scripts/README.md``, the shell
ones parse (the GPU batch runs only on a machine with a GPU, where a syntax error would be
found late), the step profile runs on the simulator, the schedule the batch replays loads,
and ``docs/results.md`` names only stages the batch has."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
ACCEPTANCE = SCRIPTS / "gpu_acceptance.sh"


def test_every_script_is_documented_in_one_line():
    readme = (SCRIPTS / "README.md").read_text()
    listed = set(re.findall(r"^- `([^`]+)`", readme, re.M))
    present = {p.relative_to(SCRIPTS).as_posix() + ("/" if p.is_dir() else "")
               for p in SCRIPTS.iterdir() if p.name not in ("README.md", "__pycache__")}
    assert listed == present, (f"not in scripts/README.md: {present - listed}; "
                               f"listed but missing: {listed - present}")


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", sorted(SCRIPTS.glob("*.sh")), ids=lambda p: p.name)
def test_the_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def acceptance_stages() -> set[str]:
    text = ACCEPTANCE.read_text()
    body = text[text.index("\nfor s in "):]
    return set(re.findall(r"^    (\w+)\)", body, re.M))


def test_the_batch_runs_every_stage_by_default_in_three_parts():
    """The default is part1, part2 and part3 in turn: together every stage once, but the
    single training sizes (train runs them all)."""
    text = ACCEPTANCE.read_text()
    parts = dict(re.findall(r'^PART(\d)="([^"]*)"', text, re.M))
    assert sorted(parts) == ["1", "2", "3"]
    assert re.search(r"^STAGES=\$\{\*:-\$PART1 \$PART2 \$PART3\}$", text, re.M)
    default = " ".join(parts[k] for k in sorted(parts)).split()
    assert len(default) == len(set(default)), "a stage in two parts"
    assert set(default) == acceptance_stages() - {"train2", "train3", "train4"}


def test_results_name_only_stages_the_batch_has():
    """A figure of docs/results.md made by the batch names its stage; the stage must exist
    and run the command the row gives beside it."""
    results = (ROOT / "docs" / "results.md").read_text()
    named = re.findall(r"`bash scripts/gpu_acceptance.sh ([\w ]+)`", results)
    assert named, "results.md names no stage of the batch"
    stages = acceptance_stages()
    for words in named:
        assert set(words.split()) <= stages, words
    assert "gpu_check" not in results and "probe_" not in results


def test_the_replayed_schedule_loads():
    from pydfccl.cli import replay

    schedule = replay.load_schedule(str(SCRIPTS / "schedules"
                                        / "three_ranks_disordered_with_syncs.json"))
    replay.check_replayable(schedule, "float32")
    assert schedule.nranks == 3


def test_step_profile_counts_every_step_and_times_each_phase():
    """The daemon built with PYDFCCL_PROFILE_STEPS=1 (on the simulator): exactly the steps
    of each workload (1,024 a copy run; 3 a ring loop of 8 elements, 512 loops a run, on
    two ranks; 2 a one-shot run on two ranks), and time in every phase of a step and of
    taking, loading and retiring a run."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, str(SCRIPTS / "profile_steps.py"),
                          "--nthreads", "1", "--runs", "2"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {cells[0]: cells[1:] for cells in map(str.split, out.stdout.splitlines())
            if cells and cells[0] in ("copy", "ring", "one_shot")}
    assert {name: row[0] for name, row in rows.items()} == dict(
        copy="2,048", ring="6,144", one_shot="8")
    for name, row in rows.items():
        cycles = [float(cell.replace(",", "")) for cell in row[1:]]
        steps, per_run = cycles[:7], cycles[9:13]   # plan..post; sq, absorb, load, retire
        assert all(c > 0 for c in steps + per_run), (name, row)


def test_the_cpu_burners_run_beside_the_command_and_end_with_it():
    out = subprocess.run([sys.executable, str(SCRIPTS / "cpu_load.py"), "-n", "2", "--",
                          sys.executable, "-c", "import sys; sys.exit(3)"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    pids = [int(p) for p in re.search(r"\(pids ([\d ]+)\)", out.stdout).group(1).split()]
    assert len(pids) == 2
    for pid in pids:     # killed and reaped: no such process
        assert not os.path.exists(f"/proc/{pid}"), pid
