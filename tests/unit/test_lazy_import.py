"""``import pydfccl`` stays cheap: Numba's CUDA target, the kernels, torch, matplotlib and
mpi4py load only when a name that needs them is used, and every public name still works."""

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("numba.cuda", "torch", "matplotlib", "mpi4py", "pydfccl.kernels.daemon")

SCRIPT = """
import json, sys
import pydfccl
before = sorted(m for m in %r if m in sys.modules)
names = {name: type(getattr(pydfccl, name)).__name__ for name in pydfccl.__all__}
print(json.dumps(dict(before=before, names=names, platform=hasattr(pydfccl.platform, "copy_in"),
                      cuda="numba.cuda" in sys.modules)))
""" % (HEAVY,)


def test_import_pydfccl_loads_no_heavy_module_and_every_public_name_resolves():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["before"] == [], f"import pydfccl loaded {report['before']}"
    import pydfccl
    assert sorted(report["names"]) == sorted(pydfccl.__all__)
    assert report["names"]["Communicator"] == "type"
    assert report["names"]["launch"] == "function"
    assert report["platform"] and report["cuda"]     # used names load what they need


def test_an_unknown_name_is_an_attribute_error():
    import pydfccl
    with pytest.raises(AttributeError, match="no_such_name"):
        pydfccl.no_such_name


@pytest.mark.parametrize("name, ours, theirs", [("CUDA_MODULE_LOADING", "EAGER", "LAZY"),
                                                 ("CUDA_DEVICE_MAX_CONNECTIONS", "32", "1")])
@pytest.mark.parametrize("chose", [False, True])
def test_import_pydfccl_sets_cudas_variables_unless_the_user_chose(name, ours, theirs, chose):
    given = theirs if chose else None
    env = {k: v for k, v in os.environ.items() if k != name}
    if given:
        env[name] = given
    proc = subprocess.run([sys.executable, "-c", "import os, pydfccl; "
                           f"print(os.environ['{name}'])"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == [given or ours]


@pytest.mark.parametrize("job", [dict(WORLD_SIZE="2", RANK="1"), dict(PMI_SIZE="4"),
                                 dict(OMPI_COMM_WORLD_SIZE="8")])
def test_a_process_that_is_one_rank_of_a_job_keeps_cudas_work_queues(job):
    """mpiexec's and torchrun's ranks: 32 queues a process exhausted MPS's connections with
    eight of them on one GPU."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    env.update(job)
    proc = subprocess.run([sys.executable, "-c", "import os, pydfccl; "
                           "print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset'))"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["unset"]


CHILD_RANK = """
import os, subprocess, sys
import pydfccl
env = dict(os.environ, RANK="1", WORLD_SIZE="4")
print(os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "unset"))
print(subprocess.run([sys.executable, "-c", "import os, pydfccl; "
                      "print(os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS', 'unset'), "
                      "os.environ.get('PYDFCCL_CHOSE_WORK_QUEUES', 'unset'))"],
                     env=env, capture_output=True, text=True, check=True).stdout.strip())
"""


@pytest.mark.parametrize("user_value, expected", [
    (None, ["32", "unset", "unset"]),      # pydfccl's choice for threads: not the rank's
    ("16", ["16", "16", "unset"]),         # the user's: kept everywhere
])
def test_a_rank_started_from_a_pydfccl_process_drops_its_work_queues(user_value, expected):
    """spawn_ranks, or mpiexec/torchrun run from a test, copy the parent's environment:
    four torch ranks with the parent's 32 queues each failed under MPS ("out of memory" from
    torch.cuda.set_device)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_DEVICE_MAX_CONNECTIONS", "PYDFCCL_CHOSE_WORK_QUEUES", "RANK",
                        "WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")}
    if user_value:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = user_value
    proc = subprocess.run([sys.executable, "-c", CHILD_RANK], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == expected


def test_launchs_rank_processes_keep_cudas_work_queues_unless_the_user_chose():
    from pydfccl.cuda_env import one_rank_per_process

    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}     # inherited from pydfccl's parent
    one_rank_per_process(True, environ)
    assert environ == {}
    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": "16"}     # the user's, inherited
    one_rank_per_process(False, environ)
    assert environ == {"CUDA_DEVICE_MAX_CONNECTIONS": "16"}
