"""A program that starts rank processes on the simulator: the launcher itself only sizes
their world, spawns and supervises them, and imports no Numba (0.4-0.5 s of CPU before the
first rank could start); the ranks import it and run as before."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_launcher_of_simulated_rank_processes_imports_no_numba(tmp_path):
    (tmp_path / "job.py").write_text(textwrap.dedent("""
        import sys

        import numpy as np
        import pydfccl


        def worker(comm):
            comm.prepare(0, "all_reduce", count=4, dtype="float32")
            comm.start()
            x = comm.empty(4, "float32")
            x[...] = comm.rank + 1
            comm.run(0, x).result(timeout=120)
            return np.asarray(x).tolist(), "numba.cuda" in sys.modules


        if __name__ == "__main__":
            print(pydfccl.launch(worker, 2))
            print("launcher:", sorted(m for m in sys.modules if m.partition(".")[0] == "numba"))
    """))
    proc = subprocess.run([sys.executable, str(tmp_path / "job.py")], cwd=tmp_path,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
                                   PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results, launcher = proc.stdout.strip().splitlines()[-2:]
    assert results == str([([3.0] * 4, True)] * 2)      # summed, by ranks that ran Numba
    assert launcher == "launcher: []"


def test_the_demo_command_runs_its_ranks_without_numba_in_its_own_process():
    """`python -m pydfccl demo`, the first command a user runs, progress bar and all: every
    output verified, and the command's own process never imported Numba."""
    script = ("import atexit, runpy, sys\n"
              "atexit.register(lambda: print('launcher:', sorted(\n"
              "    m for m in sys.modules if m.partition('.')[0] == 'numba')))\n"
              "sys.argv = ['pydfccl', 'demo', '-n', '2', '-k', '2', '-i', '3']\n"
              "runpy.run_module('pydfccl', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "outputs verified: 12 " in proc.stdout, proc.stdout[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "launcher: []"
