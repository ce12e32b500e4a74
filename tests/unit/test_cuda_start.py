"""The CUDA driver and context started beside the runtime's imports (``pydfccl.cuda_start``):
begun only where it can help and nothing else is touched, the context given back to Numba
once it holds its own, and ``launch`` leaving Numba's CUDA target unimported until it
knows that this process runs ranks itself."""

import json
import os
import subprocess
import sys

import pytest

from pydfccl import cuda_start


class FakeDriver:
    """libcuda's calls that ``cuda_start`` makes, each recorded, all succeeding."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if not name.startswith("cu"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            return 0
        return call


@pytest.fixture
def fresh(monkeypatch):
    """cuda_start as in a new process, with a fake driver and Numba's CUDA target
    not yet imported."""
    driver = FakeDriver()
    monkeypatch.setattr(cuda_start, "_thread", None)
    monkeypatch.setattr(cuda_start, "_held", None)
    monkeypatch.setattr(cuda_start, "_seconds", None)
    monkeypatch.setattr(cuda_start, "driver_library", lambda: driver)
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.delitem(sys.modules, "numba.cuda", raising=False)
    return driver


def test_begin_retains_the_primary_context_and_settle_gives_it_back(fresh):
    cuda_start.begin(device=0)
    cuda_start.settle()
    assert fresh.calls == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain",
                           "cuDevicePrimaryCtxRelease_v2"]
    assert cuda_start.background_seconds() is not None
    cuda_start.begin(device=0)            # once a process: the thread ran already
    cuda_start.settle()
    assert len(fresh.calls) == 4


def test_a_failed_driver_start_retains_and_releases_nothing(fresh, monkeypatch):
    def init(flags):
        fresh.calls.append("cuInit")
        return 100          # CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(fresh, "cuInit", init, raising=False)
    cuda_start.begin()
    cuda_start.settle()
    assert fresh.calls == ["cuInit"]


@pytest.mark.parametrize("why", ["simulator", "numba loaded"])
def test_begin_does_nothing_where_it_cannot_help(fresh, monkeypatch, why):
    if why == "simulator":
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    else:   # the program loaded Numba's CUDA target, and may have chosen another GPU
        monkeypatch.setitem(sys.modules, "numba.cuda", object())
    cuda_start.begin()
    cuda_start.settle()
    assert fresh.calls == [] and cuda_start.background_seconds() is None


def test_settle_without_begin_does_nothing(fresh):
    cuda_start.settle()
    assert fresh.calls == []


def test_launch_and_init_all_import_numba_cuda_only_once_they_run():
    """``pydfccl.launch`` and ``pydfccl.init_all`` are light imports: the runtime's modules
    (Numba's CUDA target) load once they run, beside the driver's start."""
    script = ("import json, sys, pydfccl; pydfccl.launch, pydfccl.init_all; "
              "print(json.dumps('numba.cuda' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) is False


ORDER = """
import json, sys
import pydfccl
from pydfccl import cuda_start
seen = []
cuda_start.begin = lambda device=0: seen.append("numba.cuda" in sys.modules)
try:
    %s
except pydfccl.PydfcclError:        # the simulator: no rank threads, no init_all
    pass
print(json.dumps(seen))
"""


@pytest.mark.parametrize("call", ['pydfccl.launch(print, 2, backend="threads")',
                                  "pydfccl.init_all(2)"])
def test_launch_and_init_all_begin_before_they_import_the_runtime(call):
    """On the user's path (``pydfccl.launch`` with rank threads, ``pydfccl.init_all``), in a
    fresh process, the driver's start is begun before Numba's CUDA target is imported, so
    the two overlap."""
    proc = subprocess.run([sys.executable, "-c", ORDER % call], capture_output=True,
                          text=True, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [False]
