"""Fixtures of the kernel tests."""

import json
import os
import subprocess
import sys

import pytest


@pytest.fixture
def simulated_report():
    """Runs a script in a fresh simulator process (kernels called directly need a process of
    their own) and returns the JSON object it printed last."""
    def run(script: str) -> dict:
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])
    return run
