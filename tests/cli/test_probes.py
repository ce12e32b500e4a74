"""The probes that run without a GPU keep working, and a GPU-only one compiles."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_host_path_probe_completes_runs_against_its_echo_daemon():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, str(SCRIPTS / "probe_host_path.py"), "--iters", "300"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "host only (echo daemon), 300 runs: median" in out.stdout


def test_submit_floor_probe_times_its_minimal_submit():
    """The least a Python submit costs (docs/benchmarks.md weighs the latency targets
    against it); its check that every call stored its entry holds."""
    out = subprocess.run([sys.executable, str(SCRIPTS / "probe_submit_floor.py"),
                          "--runs", "2000"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0].startswith("least Python submit (5 stores and a future): ")
    per_call = float(lines[0].split(": ")[1].split()[0])
    assert 0 < per_call < 1000
    assert lines[2].startswith("  one thread, 8 ranks: ")
    assert abs(float(lines[2].split(": ")[1].split()[0]) - 8 * per_call) < 0.05   # rounding


def test_step_profile_counts_every_step_and_times_each_phase():
    """The daemon built with PYDFCCL_PROFILE_STEPS=1 (on the simulator): exactly the steps
    of each workload (1,024 a copy run; 3 a ring loop of 8 elements, 512 loops a run, on
    two ranks; 2 a one-shot run on two ranks), and time in every phase of a step and of
    taking, loading and retiring a run."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, str(SCRIPTS / "probe_step_phases.py"),
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


def test_probe_big_summarizes_an_event_log(tmp_path):
    """A two-rank, one-channel log: runs of 3 and 5 us, the ranks taking each run 1 and 2 us
    apart, and one launch per rank."""
    import gzip
    import json

    def ev(t, rank, event, coll=0):
        return dict(t_ns=t * 1000, rank=rank, block=0, event=event, coll=coll, loop=0, step=0)

    events = [dict(ev(0, rank, "launched", None), sm=7) for rank in (0, 1)]   # one SM
    for rank, (start, extra) in enumerate(((10, 0), (11, 2))):
        events += [ev(start, rank, "absorbed"), ev(start, rank, "loaded"),
                   ev(start + 3, rank, "completed"), ev(20 + extra, rank, "absorbed"),
                   ev(20 + extra, rank, "loaded"), ev(25 + extra, rank, "completed")]
    path = tmp_path / "log.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(dict(policy="dfccl", sizes=[64], nblocks=1, slot_bytes=256, events=events), f)
    out = subprocess.run([sys.executable, str(SCRIPTS / "probe_big.py"), "--summarize",
                          str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "launches per rank 1, 1" in out.stdout
    assert "a block's share of a run      4.0 us (blocks 4.0 to 4.0)" in out.stdout
    assert "2 daemon blocks on 1 multiprocessors, at most 2 on one" in out.stdout
    assert "2 blocks with a share on 1 multiprocessors, at most 2 on one" in out.stdout
    assert "ranks took a run 1.5 us apart (at most 2.0), 2 runs" in out.stdout
    # per run, from the first block's take to the last completion; block 0's event gaps
    assert "first take -> last take 0.0 us, -> block 0 completed 4.0 us, -> last completed " \
           "4.0 us" in out.stdout
    assert "   loaded -> completed      4.0 (4)" in out.stdout
    assert "completed -> absorbed       7.5 (2)" in out.stdout


def _probe_ptx(script: str, kernel: str, signature: str) -> str:
    """A GPU-only probe's kernel compiled to PTX for sm_90, the way the daemon is checked (in
    a process without the simulator)."""
    code = f"""
import importlib.util
from numba import cuda
from pydfccl.kernels.ptx import _without_driver
spec = importlib.util.spec_from_file_location("probe", {str(SCRIPTS / script)!r})
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)
with _without_driver((9, 0)):
    ptx, _ = cuda.compile_ptx(probe.{kernel}.py_func, {signature!r}, cc=(9, 0))
print(ptx)
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_the_contention_probe_compiles_for_the_h200():
    """GPU-only; its kernel has the loads, stores and fences it times (docs/benchmarks.md
    cites it)."""
    ptx = _probe_ptx("probe_contention.py", "probe",
                     "void(int64, int64, int64, int64, int64, int64[:])")
    for instruction in ("%globaltimer", "%clock64", "ld.volatile", "st.volatile",
                        "fence.acq_rel.sys", "fence.acq_rel.gpu"):
        assert instruction in ptx, instruction


def test_the_floor_probe_compiles_for_the_h200():
    """GPU-only (its rank kernels spin side by side, which the simulator's blocking launches
    cannot): the host-memory acquire it polls with, the peers' flags and the system fence
    before the completion word."""
    ptx = _probe_ptx("probe_floor.py", "rank_loop",
                     "void(int64, int64, int64, int64, int64, int64, int64)")
    for instruction in ("ld.acquire.sys", "ld.volatile", "st.volatile", "fence.acq_rel.sys",
                        "fence.acq_rel.gpu"):
        assert instruction in ptx, instruction
    relay = _probe_ptx("probe_floor.py", "relay", "void(int64, int64, int64)")
    for instruction in ("ld.acquire.sys", "st.release"):
        assert instruction in relay, instruction
