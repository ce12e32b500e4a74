"""pydfccl: deadlock-free GPU collective communication in Python (Numba-CUDA).

One persistent daemon kernel per rank runs every collective, preempts a collective whose
primitive spins past its budget, resumes it later exactly where it stopped, and quits
voluntarily when idle or stuck so that GPU synchronizations can complete.

``import pydfccl`` is cheap: the names below that need Numba's CUDA target (and through it
the kernels) are imported when first used (PEP 562), so that a process that only reads a
version, a policy or an error class does not pay seconds for them.
"""

import importlib as _importlib
import os as _os

# CUDA loads a kernel's code at its first launch (lazy loading, its default since CUDA 12.2),
# and such a load may wait for the whole device, a spinning daemon or a peer's kernel
# included, while they wait for a collective that the loading rank has yet to issue. With
# every kernel loaded when the context is made, no launch waits for a collective. It must be
# set before anything in the process initializes CUDA (Numba, torch, CuPy).
_os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
# Streams beyond the hardware work queues of a process (CUDA's default 8) share queues, and
# work queued behind a kernel that spins for a peer waits with it: ranks that are threads of
# one process, under MPS, deadlocked so (a kernel launched per collective, as NCCL does, on
# four rank threads). 32, the most CUDA allows, keeps every rank's stream in a queue of its
# own; set before CUDA starts, like the line above.
_os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")

from .bootstrap.mpi import use_simulator_without_gpu as _use_simulator_without_gpu

_use_simulator_without_gpu()   # under mpiexec without a GPU; must come before Numba loads

from .errors import (AbortedError, DeadlockError, PydfcclError, RankFailedError,  # noqa: E402
                     SpansHostsError)
from .log import configure_from_env as _configure_logging  # noqa: E402
from .sched.policies import Policy, get_policy, policy_names, register  # noqa: E402

__all__ = [
    "Communicator", "Array", "launch", "BACKENDS", "WorldConfig", "init_all", "start_all",
    "close_all",
    "Policy", "register", "get_policy", "policy_names",
    "PydfcclError", "DeadlockError", "AbortedError", "RankFailedError", "SpansHostsError",
]
__version__ = "0.1.0"

# public name -> the module that defines it, imported on first use
_LAZY = {
    "Communicator": "pydfccl.host.communicator",
    "Array": "pydfccl.host.arrays",
    "WorldConfig": "pydfccl.host.world",
    "init_all": "pydfccl.bootstrap.group",
    "start_all": "pydfccl.bootstrap.group",
    "close_all": "pydfccl.bootstrap.group",
    "launch": "pydfccl.bootstrap.launch",
    "BACKENDS": "pydfccl.bootstrap.launch",
}
# subpackages reachable as attributes after a plain ``import pydfccl`` (pydfccl.platform...)
_SUBPACKAGES = ("bootstrap", "cli", "host", "kernels", "platform", "protocol", "sched", "torch")


def __getattr__(name):
    if name in _SUBPACKAGES:
        return _importlib.import_module(f"pydfccl.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pydfccl' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))


_configure_logging()
