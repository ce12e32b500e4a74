"""Ranks started one process each with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), no MPI: rank 0 serves a loopback store. The chaos demo completes, and a rank
that never joins is named instead of waited for."""

import os
import re
import subprocess
import sys

import pytest

from pydfccl.bootstrap.store import free_port


def _start(rank, size, port, *argv, extra=None):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), **(extra or {}))
    return subprocess.Popen([sys.executable, "-m", "pydfccl", "demo", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_demo_with_torchrun_variables_verifies_every_result():
    port = free_port()
    procs = [_start(r, 3, port, "-i", "2", "-k", "3") for r in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    stdout = outs[0][0]
    assert "3 ranks (a process each)" in stdout and "outputs verified: 18 " in stdout
    assert outs[1][0] == outs[2][0] == ""        # rank 0 reports for everyone


def test_a_rank_that_never_joins_is_named():
    port = free_port()
    lonely = _start(0, 2, port, "-i", "1", "-k", "2",
                    extra=dict(PYDFCCL_JOIN_TIMEOUT="3"))
    out, err = lonely.communicate(timeout=120)
    assert lonely.returncode != 0
    assert "rank 1 did not arrive within 3 s" in out + err


def test_ranks_on_two_hosts_are_refused_on_every_rank():
    """One rank a host (emulated): ``from_env()`` raises the refusal naming both hosts on
    each rank, instead of opening segments the other host could not reach."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    program = ("import pydfccl\n"
               "try:\n"
               "    pydfccl.Communicator.from_env()\n"
               "except pydfccl.SpansHostsError as exc:\n"
               "    print(exc)\n")
    procs = [subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r), WORLD_SIZE="2", MASTER_PORT=str(port),
                                       MASTER_ADDR="127.0.0.1", PYDFCCL_RANKS_PER_NODE="1"))
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    for out, _ in outs:
        assert out.startswith("this job's 2 ranks run on 2 hosts (hosts emulated by "
                              "PYDFCCL_RANKS_PER_NODE=1): rank 0 on node0; rank 1 on node1")


KILLED = """
import os, signal, time
import numpy as np
import pydfccl
comm = pydfccl.Communicator.from_env()
comm.prepare(0, "all_reduce", count=8, dtype="int64")
comm.start()
if comm.rank == 2:
    os.kill(os.getpid(), signal.SIGKILL)     # dies with its peers' collective pending
x = comm.empty(8, "int64")                    # on this rank's device (host memory: simulator)
x[...] = 1
t0 = time.monotonic()
try:
    comm.run(0, x).result(timeout=120)
    print("completed?!")
except pydfccl.PydfcclError as exc:
    print(f"rank {comm.rank} after {time.monotonic() - t0:.1f} s: {exc}")
comm.close()
"""


def test_a_killed_rank_is_named_at_once_from_its_process(tmp_path):
    """No heartbeat timeout is waited for: the peers see the process gone."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, str(script)], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(3)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert procs[2].returncode == -9
    for rank in (0, 1):
        out = outs[rank][0]
        assert f"rank {rank} after" in out, outs[rank]
        assert re.search(r"rank failure: rank 2: its process \(pid \d+\) ended without "
                         "closing its communicator", out), out
        seconds = float(out.split(" after ")[1].split(" s:")[0])
        assert seconds < 30, out
        print(f"\nrank {rank}: the error {seconds:.1f} s after it submitted")
    # rank 0 made the world's segments (named after its pid) and unlinked them
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pydfccl_{procs[0].pid}_")]


def test_world_segments_are_named_after_their_maker():
    from pydfccl.host.world_config import new_segment

    segment = new_segment(64)
    try:
        assert segment.name.startswith(f"pydfccl_{os.getpid()}_")
        assert segment.name.lstrip("/") in os.listdir("/dev/shm")
    finally:
        segment.close()
        segment.unlink()


def test_torchrun_runs_the_demo_on_its_own_store():
    """``torchrun --standalone --nproc_per_node=3 -m pydfccl demo`` as a user types it: the
    ranks meet at torchrun's own store (its agent holds MASTER_PORT), not one of pydfccl's."""
    import shutil
    from pathlib import Path

    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or \
        shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("no torchrun beside this Python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "RANK", "WORLD_SIZE", "MASTER_PORT")}
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node=3", "-m", "pydfccl",
                           "demo"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "3 ranks (a process each)" in done.stdout
    assert "outputs verified: 120 " in done.stdout and "Address already in use" not in done.stderr
