"""The platform backend (``pydfccl.platform``): chosen once, and asked by name what differs.

Library code outside ``pydfccl/platform/`` must not test which backend runs
(``SIMULATOR``, ``LAUNCHES_ARE_QUEUED``, ``WAIT_SPIN_SECONDS``); device code in
``pydfccl/kernels/`` has its own flag. The backend classes are read here, not made: making
the simulator's would patch Numba's simulator in this process. The GPU backend's module
needs Numba's CUDA target, so its attributes are read in a process that asks for it
(``NUMBA_ENABLE_CUDASIM=0``): without a driver, this one runs the simulator."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pydfccl import platform
from pydfccl.platform.base import Backend
from pydfccl.platform.simulator import SimulatedBuffer, SimulatorBackend
from pydfccl.sched.policies import get_policy

LIBRARY = Path(platform.__file__).resolve().parents[1]
# The platform's flags, read through the module or imported from it (or from the kernels'
# memory module): the model's own backend names in sched/ are not them.
_FLAGS = r"(SIMULATOR|LAUNCHES_ARE_QUEUED|WAIT_SPIN_SECONDS)\b"
WHICH_BACKEND = re.compile(rf"\b(platform|memory)\.{_FLAGS}"
                           rf"|from \S*(platform|memory) import .*\b{_FLAGS}")


def test_library_code_asks_the_backend_what_differs_not_which_it_is():
    offenders = []
    for path in sorted(LIBRARY.rglob("*.py")):
        part = path.relative_to(LIBRARY).parts[0]
        if part in ("platform", "kernels"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if WHICH_BACKEND.search(line):
                offenders.append(f"{path.relative_to(LIBRARY.parent)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


GPU_ATTRIBUTES = """
import json
from pydfccl.platform.gpu import GpuBackend as b
print(json.dumps(dict(name=b.name, kernels_on_host=b.kernels_on_host,
    device_memory_is_host=b.device_memory_is_host, launch_runs_kernel=b.launch_runs_kernel,
    one_kernel_per_process=b.one_kernel_per_process,
    waiter_spin_seconds=b.waiter_spin_seconds, watchdog_seconds=b.watchdog_seconds,
    numba_device_array=b.numba_device_array is not None)))
"""


def _gpu_backend():
    proc = subprocess.run([sys.executable, "-c", GPU_ATTRIBUTES], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return SimpleNamespace(**json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_backends_differ_as_their_attributes_say():
    sim, gpu = SimulatorBackend, _gpu_backend()
    assert (sim.name, gpu.name) == ("simulator", "gpu")
    for flag in ("kernels_on_host", "device_memory_is_host", "launch_runs_kernel",
                 "one_kernel_per_process"):
        assert getattr(sim, flag) and not getattr(gpu, flag), flag
    assert sim.waiter_spin_seconds == 0 < gpu.waiter_spin_seconds
    assert sim.watchdog_seconds > gpu.watchdog_seconds
    assert sim.numba_device_array is None and gpu.numba_device_array


def test_the_module_functions_are_the_chosen_backends():
    backend = platform.backend
    assert isinstance(backend, Backend)
    assert backend.kernels_on_host == platform.SIMULATOR
    assert platform.WAIT_SPIN_SECONDS == backend.waiter_spin_seconds
    assert platform.LAUNCHES_ARE_QUEUED == (not backend.launch_runs_kernel)
    for name in ("launch", "empty", "to_numpy", "copy_in", "gpu_available", "new_stream",
                 "synchronize_device", "address_of"):
        assert getattr(platform, name) == getattr(backend, name), name


def test_a_policy_takes_the_parameters_of_the_backend_its_daemon_runs_on():
    policy = get_policy("dfccl")
    on_host = Backend.policy_params(SimpleNamespace(kernels_on_host=True), policy)
    on_gpu = Backend.policy_params(SimpleNamespace(kernels_on_host=False), policy)
    assert on_host.tolist() == policy.param_array(simulator=True).tolist()
    assert on_gpu.tolist() == policy.param_array().tolist()


def test_zero_rows_zeroes_each_strided_region_and_nothing_else():
    """A shared slot's reset (``host/shared_slots.py``) is three strided regions of the
    pool, zeroed in one call: the simulator's buffer zeroes exactly those bytes."""
    buf = SimulatedBuffer(64)
    buf.array[:] = 0xFF
    buf.zero_rows([(2, 10, 3, 4), (50, 4, 4, 1)], write=(60, np.array([7, 8], np.uint16)))
    zeroed = {o + k for o in (2, 12, 22, 32) for k in range(3)} | set(range(50, 54)) | {61, 63}
    assert sorted(np.flatnonzero(buf.array == 0).tolist()) == sorted(zeroed)
    assert buf.array[60:64].view(np.uint16).tolist() == [7, 8]
    for region in [(40, 10, 3, 4), (0, 2, 3, 2), (-1, 4, 4, 1)]:
        with pytest.raises(IndexError, match="is not inside 64 bytes"):
            buf.zero_rows([region])


SWITCH_INTERVAL = """
import json, sys
if len(sys.argv) > 1:
    sys.setswitchinterval(float(sys.argv[1]))      # the program's own, before the platform
from pydfccl import platform
print(json.dumps(sys.getswitchinterval()))
"""


@pytest.mark.parametrize("chosen, after", [(None, 1e-4), (5e-4, 5e-4), (0.02, 0.02)])
def test_the_simulator_shortens_pythons_switch_interval_but_keeps_a_programs_own(chosen, after):
    argv = [] if chosen is None else [repr(chosen)]
    proc = subprocess.run([sys.executable, "-c", SWITCH_INTERVAL, *argv], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == pytest.approx(after)
