"""The early CUDA start (pydfccl/cuda_start.py): the runtime's packages call it before
Numba's CUDA target is imported, whichever public name brings them in; on one GPU it
retains that GPU's primary context, on several it starts the driver alone, and it starts
nothing without a driver, under the simulator, when held or switched off. The driver is a
stand-in here (no GPU in CI)."""

import json
import os
import subprocess
import sys

import pytest

from pydfccl import cuda_start

ORDER = """
import json, sys
import pydfccl.cuda_start as c
calls = []
c.start = lambda: calls.append("numba.cuda" in sys.modules)
import pydfccl
%s
print(json.dumps(calls))
"""


@pytest.mark.parametrize("use", ["pydfccl.Communicator", "pydfccl.WorldConfig",
                                 "pydfccl.launch", "import pydfccl.torch"])
def test_the_runtime_starts_cuda_before_numba_cuda_is_imported(use):
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", ORDER % use], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = json.loads(proc.stdout.strip().splitlines()[-1])
    assert calls and calls[0] is False, f"{use}: numba.cuda was imported first ({calls})"


class _Driver:
    """libcuda's few calls, with ``gpus`` devices; records the calls made."""

    def __init__(self, gpus: int, init: int = 0):
        self.gpus, self.init, self.calls = gpus, init, []

    def cuInit(self, flags):
        self.calls.append("cuInit")
        return self.init

    def cuDeviceGetCount(self, count):
        count._obj.value = self.gpus
        return 0

    def cuDeviceGet(self, device, ordinal):
        self.calls.append(f"cuDeviceGet {ordinal}")
        device._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, context, device):
        self.calls.append(f"retain {device.value}")
        return 0


@pytest.fixture
def fresh(monkeypatch):
    """cuda_start as a process that has not started yet, the simulator off."""
    monkeypatch.setattr(cuda_start, "_thread", None)
    monkeypatch.setattr(cuda_start, "_held", False)
    monkeypatch.setattr(cuda_start, "outcome", None)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    monkeypatch.delenv(cuda_start.ENV, raising=False)
    monkeypatch.setattr(cuda_start.atexit, "register", lambda *a: None)

    def with_driver(driver):
        def load(name):
            if driver is None:
                raise OSError(f"{name}: cannot open shared object file")
            return driver
        monkeypatch.setattr(cuda_start.ctypes, "CDLL", load)
    return with_driver


@pytest.mark.parametrize("gpus, outcome, calls", [
    (1, "context", ["cuInit", "cuDeviceGet 0", "retain 0"]),
    (2, "driver only (2 GPUs: the rank's is chosen later)", ["cuInit"]),
    (0, "driver only (0 GPUs: the rank's is chosen later)", ["cuInit"]),
])
def test_one_gpu_gets_its_primary_context_several_the_driver_alone(fresh, gpus, outcome,
                                                                   calls):
    driver = _Driver(gpus)
    fresh(driver)
    cuda_start.start()
    cuda_start.start()                          # once a process
    assert cuda_start.wait(10) == outcome
    assert driver.calls == calls


def test_nothing_without_a_driver(fresh):
    fresh(None)
    cuda_start.start()
    assert cuda_start.wait(10) == "no driver"


def test_a_driver_that_fails_to_start_is_left_to_numba(fresh):
    driver = _Driver(1, init=100)                # CUDA_ERROR_NO_DEVICE
    fresh(driver)
    cuda_start.start()
    assert cuda_start.wait(10) == "no GPU" and driver.calls == ["cuInit"]


@pytest.mark.parametrize("how", ["held", "switched off", "simulator"])
def test_no_thread_when_held_switched_off_or_under_the_simulator(fresh, monkeypatch, how):
    driver = _Driver(1)
    fresh(driver)
    if how == "held":
        cuda_start.hold()
    elif how == "switched off":
        monkeypatch.setenv(cuda_start.ENV, "0")
    else:
        monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    cuda_start.start()
    assert cuda_start._thread is None and cuda_start.wait(1) is None and driver.calls == []


def test_build_kernels_holds_the_start():
    """build-kernels compiles on the CPU: it must not make a context on a GPU machine."""
    script = ("import pydfccl.cli.build_kernels, pydfccl.cuda_start as c, json; "
              "print(json.dumps([c._held, c._thread is None]))")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [True, True]
