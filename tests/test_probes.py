"""The probe that runs without a GPU keeps working (the others need one)."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_host_path_probe_completes_runs_against_its_echo_daemon():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    out = subprocess.run([sys.executable, str(SCRIPTS / "probe_host_path.py"), "--iters", "300"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "host only (echo daemon), 300 runs: median" in out.stdout
