"""property_tests/' default profile, "ci": the same examples every run where CI is set (as
Hypothesis' own "ci" profile, which it replaces, draws them), random ones elsewhere."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROPERTY_TESTS = Path(__file__).resolve().parents[2] / "property_tests"
SHOW = "import conftest; from hypothesis import settings; print(settings().derandomize)"


@pytest.mark.parametrize("ci, derandomized", [("true", "True"), ("", "False")])
def test_the_default_profile_is_derandomized_where_ci_is_set(ci, derandomized):
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_PROFILE"}
    env["CI"] = ci
    proc = subprocess.run([sys.executable, "-c", SHOW], cwd=PROPERTY_TESTS, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [derandomized]
