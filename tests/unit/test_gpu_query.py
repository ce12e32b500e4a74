"""``gpu_query``: what a launcher asks the CUDA driver (a GPU? its multiprocessors?) is
answered through ctypes, and on a machine with a driver the commands that run ranks decide
where they run, and size their world, without loading Numba's CUDA target: loaded, it would
keep ``cuda_start`` from making the context beside its import."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A driver that shows one GPU of 132 multiprocessors (an H100's or H200's count).
ONE_GPU = """
int cuInit(unsigned flags) { return 0; }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int i) { if (i != 0) return 101; *d = i; return 0; }
int cuDeviceGetAttribute(int *v, int attribute, int d) {
    if (attribute != 16) return 1;
    *v = 132; return 0;
}
"""
SCHEDULE = (Path(__file__).resolve().parents[2] / "scripts" / "schedules"
            / "three_ranks_disordered_with_syncs.json")
NO_DEVICE = "int cuInit(unsigned flags) { return 100; }\n"     # CUDA_ERROR_NO_DEVICE

LAUNCHER = """
import json, sys
import pydfccl.cli.bench, pydfccl.cli.demo, pydfccl.cli.registration_bench
import pydfccl.cli.replay_cmd, pydfccl.cli.teach
from pydfccl import gpu_query
from pydfccl.bootstrap.launch import default_backend
from pydfccl.host.world_config import WorldConfig, gpu_nblocks, on_gpu
config = WorldConfig(4)
print(json.dumps(dict(gpus=gpu_query.gpu_count(), sms=gpu_query.multiprocessors(),
                      other_gpu=gpu_query.multiprocessors(1), on_gpu=on_gpu(),
                      backend=default_backend(), simulator=config.simulator,
                      nblocks=config.nblocks, expected_nblocks=gpu_nblocks(4, 512),
                      numba=sorted(m for m in sys.modules if m.partition(".")[0] == "numba"))))
"""


def _launcher(folder: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "PYDFCCL_BACKEND")}
    env["LD_LIBRARY_PATH"] = folder
    proc = subprocess.run([sys.executable, "-c", LAUNCHER], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_launcher_on_a_gpu_machine_decides_and_sizes_without_numba(standin_driver):
    report = _launcher(standin_driver(ONE_GPU))
    assert report["gpus"] == 1 and report["sms"] == 132 and report["other_gpu"] is None
    assert report["on_gpu"] and report["backend"] == "threads"
    assert report["simulator"] is False
    # 132 multiprocessors, 4 ranks of 512 threads: 32 blocks a rank fit (gpu_nblocks)
    assert report["nblocks"] == report["expected_nblocks"] == 32
    assert report["numba"] == []


def test_a_driver_that_sees_no_gpu_means_no_gpu(standin_driver):
    report = _launcher(standin_driver(NO_DEVICE))
    assert report["gpus"] == 0 and report["sms"] is None and not report["on_gpu"]
    assert report["backend"] == "processes"


def test_under_the_simulator_nothing_is_asked_of_a_driver(monkeypatch):
    from pydfccl import cuda_start, gpu_query

    def no_driver():
        raise AssertionError("asked the driver under the simulator")
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.setattr(gpu_query, "driver_library", no_driver)
    assert cuda_start.simulated()
    assert gpu_query.gpu_count() == 0 and gpu_query.multiprocessors() is None



COMMAND_UP_TO_LAUNCH = """
import json, os, runpy, sys
from pydfccl import cuda_start

def begin(device=0):      # launch() and init_all() call it first, for rank threads
    print(json.dumps(sorted(m for m in sys.modules if m.partition(".")[0] == "numba")))
    sys.stdout.flush()
    os._exit(0)

cuda_start.begin = begin
sys.argv = ["pydfccl"] + sys.argv[1:]
runpy.run_module("pydfccl", run_name="__main__")
"""


@pytest.mark.parametrize("argv", [["demo", "-n", "2", "-k", "2", "-i", "1"],
                                  ["bench", "-n", "2", "-b", "8", "-e", "8"],
                                  ["bench", "latency", "-n", "2", "--iters", "1"],
                                  ["teach", "--iters", "2"],
                                  ["replay", str(SCHEDULE)]])
def test_a_command_reaches_launch_on_a_gpu_machine_without_numba(standin_driver, argv):
    """Each command that runs ranks, run as a user types it on a machine with a GPU, has loaded no Numba
    when ``launch`` or ``init_all`` begins the CUDA context, which can then be made beside
    Numba's import (the stand-in driver makes none: the test ends there)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_ENABLE_CUDASIM", "PYDFCCL_BACKEND")}
    env["LD_LIBRARY_PATH"] = standin_driver(ONE_GPU)
    proc = subprocess.run([sys.executable, "-c", COMMAND_UP_TO_LAUNCH, *argv], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
