"""Faults in a job launched by ``pydfccl.launch`` (rank processes on the simulator), each
with the outcome a user must see and a bound on the time it takes: the rank at fault named,
the others ended, nothing left running or in /dev/shm, never a hang."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import pydfccl

START = 5.0       # PYDFCCL_START_TIMEOUT for these jobs


def fault_worker(comm, fault, who):
    """Rank ``who`` does ``fault`` at its moment; every rank otherwise runs an all-reduce."""
    mine = comm.rank == who
    if mine and fault == "raise_before_start":
        raise ValueError("injected before start")
    if mine and fault == "return_before_start":
        return "left early"
    if mine and fault == "exit":
        os._exit(3)
    if mine and fault == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mine and fault == "sleep_before_start":
        time.sleep(60)
    if mine and fault == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    comm.prepare(0, "all_reduce", count=4, dtype="int64")
    comm.start()
    if mine and fault == "raise_after_start":
        raise ValueError("injected after start")
    x = comm.empty(4, "int64")
    x[...] = comm.rank + 1
    return np.asarray(comm.run(0, x).result(timeout=60)).tolist()


CASES = [  # fault, what the error says
    ("raise_before_start", r"rank 1: ValueError: injected before start"),
    ("raise_after_start", r"rank 1: ValueError: injected after start"),
    ("return_before_start", r"rank \d: .*not every rank arrived: rank 1 returned"),
    ("exit", r"rank 1: process died with exit code 3"),
    ("sigkill", r"rank 1: process died with exit code -9"),
    ("sleep_before_start", r"rank 1: did not call start\(\) \(or barrier\(\)\) within 5 s"),
    ("sigstop", r"rank 1: did not call start\(\) \(or barrier\(\)\) within 5 s"),
]


def _segments(maker: int):
    """The shared-memory segments a launcher made (named after its pid) still there."""
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"pydfccl_{maker}_")]


@pytest.mark.parametrize("fault, message", CASES, ids=[c[0] for c in CASES])
def test_a_faulty_rank_is_named_and_the_job_ends(monkeypatch, fault, message):
    from pydfccl.bootstrap import processes

    monkeypatch.setattr(processes, "START_TIMEOUT", START)
    t0 = time.monotonic()
    with pytest.raises(pydfccl.RankFailedError, match=message):
        pydfccl.launch(fault_worker, 3, args=(fault, 1), backend="processes", timeout=120)
    took = time.monotonic() - t0
    assert took < START + processes.GRACE_SECONDS + 30, f"{fault} took {took:.1f} s"
    assert not _segments(os.getpid())


def test_the_job_runs_as_before_without_faults():
    assert pydfccl.launch(fault_worker, 3, args=("none", 1), backend="processes",
                          timeout=120) == [[6] * 4] * 3


LAUNCHER = textwrap.dedent("""
    import os, sys, time
    import pydfccl

    def worker(comm):
        print(f"rank {comm.rank} pid {os.getpid()}", flush=True)
        time.sleep(120)

    if __name__ == "__main__":
        print(f"launcher {os.getpid()}", flush=True)
        pydfccl.launch(worker, 2, backend="processes")
""")


def _start_launcher(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids = []
    deadline = time.monotonic() + 120
    while len(pids) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("rank "):
            pids.append(int(line.split()[-1]))
    assert len(pids) == 2, proc.stderr.read()[-3000:]
    return proc, pids


def _gone(pids, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(")")[-1].split()[0] != "Z":
                        alive.append(pid)
            except (ProcessLookupError, FileNotFoundError):
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm")
@pytest.mark.parametrize("how", ["launcher_sigkill", "launcher_sigterm", "group_sigkill"])
def test_ranks_die_with_their_launcher_and_leave_no_segments(tmp_path, how):
    proc, pids = _start_launcher(tmp_path)
    if how == "group_sigkill":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal(signal.SIGKILL if how == "launcher_sigkill" else signal.SIGTERM)
    proc.wait(timeout=30)
    assert _gone(pids), f"ranks {pids} outlived their launcher"
    assert not _segments(proc.pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_ctrl_c_ends_the_job_within_seconds_in_one_line(tmp_path):
    proc, pids = _start_launcher(tmp_path)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 5 and _gone(pids)
    assert "interrupted; every rank stopped" in err
    assert err.count("Traceback") <= 1      # the launcher's own, none from the ranks
