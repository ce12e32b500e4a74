"""Ranks started by mpiexec (one process each, bootstrapped through mpi4py): the chaos demo
completes, its nccl twin is reported as a deadlock, and start() compares registrations
across the processes. Without a GPU the processes run the simulator."""

import os
import subprocess
import sys
import textwrap

import pytest

from pydfccl.cli.doctor import find_mpiexec

MPIEXEC = find_mpiexec()
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec (pip install mpich)")
pytest.importorskip("mpi4py")


def _mpiexec(n, *argv, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *argv], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_under_mpiexec_verifies_every_result():
    done = _mpiexec(3, "-m", "pydfccl", "demo", "-i", "2", "-k", "4", "--kinds", "all")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 ranks (a process each)" in done.stdout
    assert "outputs verified: 24 " in done.stdout     # 4 kinds (no reduce) x 3 ranks x 2


def test_nccl_policy_under_mpiexec_is_a_reported_deadlock():
    done = _mpiexec(3, "-m", "pydfccl", "demo", "-i", "2", "-k", "3",
                    "--policy", "nccl", "--watchdog", "5")
    assert done.returncode == 3, done.stdout + done.stderr
    assert "wait-for cycle: rank 0 -> rank 2 -> rank 1 -> rank 0" in done.stderr


def test_start_compares_registrations_across_processes(tmp_path):
    script = tmp_path / "mismatch.py"
    script.write_text(textwrap.dedent("""
        from mpi4py import MPI
        import pydfccl
        rank = MPI.COMM_WORLD.rank
        with pydfccl.Communicator.from_mpi(MPI.COMM_WORLD) as comm:
            comm.prepare(0, "all_reduce", count=4 + (rank == 1))
            try:
                comm.start()
            except ValueError as exc:
                print(f"rank {rank} refused: {exc}", flush=True)
    """))
    done = _mpiexec(2, str(script), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        assert (f"rank {rank} refused: collective 0: field 'count' differs across ranks "
                "(ranks [0]: 4; ranks [1]: 5)") in done.stdout
