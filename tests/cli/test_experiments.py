"""The experiments kept for a GPU session (``scripts/experiments/*.patch``, applied by
``scripts/gpu_commits.sh prepare``) still apply to this tree: a stale one would cost that
session a device call."""

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "scripts" / "experiments").glob("*.patch"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_the_experiment_applies_to_this_tree(patch):
    done = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert patch.read_text().split("diff --git", 1)[0].strip(), "say what it tries, first"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("script", sorted((ROOT / "scripts").glob("*.sh")),
                         ids=lambda p: p.name)
def test_the_gpu_batch_scripts_parse(script):
    """The GPU batches run only on a lent machine: a syntax error found there costs a call."""
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_every_ab_workload_the_batch_names_is_defined():
    """blocks_ab and head_ab run workloads by name (``workload NAME``); a name without a
    case would only print 'unknown workload' on the GPU."""
    import re

    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    body = text[text.index("workload() {"):text.index("\n}\n", text.index("workload() {"))]
    defined = set(re.findall(r"^\s{4}(\w+)\)", body, re.M))
    named = {w for default in re.findall(r"\$\{AB_WORKLOADS:-([^}]*)\}", text)
             for w in default.split()}
    assert named and named <= defined, named - defined
