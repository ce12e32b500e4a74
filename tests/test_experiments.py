"""The experiments kept for a GPU session (``scripts/experiments/*.patch``, applied by
``scripts/gpu_commits.sh prepare``) still apply to this tree: a stale one would cost that
session a device call."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATCHES = sorted((ROOT / "scripts" / "experiments").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_the_experiment_applies_to_this_tree(patch):
    done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert patch.read_text().split("diff --git", 1)[0].strip(), "say what it tries, first"
