"""pydfccl: deadlock-free GPU collective communication in Python (Numba-CUDA).

One persistent daemon kernel per rank runs every collective, preempts a collective whose
primitive spins past its budget, resumes it later exactly where it stopped, and quits
voluntarily when idle or stuck so that GPU synchronizations can complete.

``import pydfccl`` is cheap: the names below that need Numba's CUDA target (and through it
the kernels) are imported when first used (PEP 562), so that a process that only reads a
version, a policy or an error class does not pay seconds for them.
"""

import importlib as _importlib

from .cuda_env import set_before_cuda as _set_before_cuda

_set_before_cuda()   # CUDA reads them once, when it starts: before anything can start it

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
    "WorldConfig": "pydfccl.host.world_config",
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
