"""pydfccl: deadlock-free GPU collective communication in Python (Numba-CUDA).

One persistent daemon kernel per rank runs every collective, preempts a collective whose
primitive spins past its budget, resumes it later exactly where it stopped, and quits
voluntarily when idle or stuck so that GPU synchronizations can complete.
"""

from .bootstrap.mpi import use_simulator_without_gpu as _use_simulator_without_gpu

_use_simulator_without_gpu()   # under mpiexec without a GPU; must come before Numba loads

from .host.communicator import Communicator  # noqa: E402
from .host.arrays import Array
from .errors import AbortedError, DeadlockError, PydfcclError, RankFailedError
from .bootstrap.group import close_all, init_all, start_all
from .bootstrap.launch import BACKENDS, launch
from .log import configure_from_env as _configure_logging
from .sched.policies import Policy, get_policy, policy_names, register
from .host.world import WorldConfig

__all__ = [
    "Communicator", "Array", "launch", "BACKENDS", "WorldConfig", "init_all", "start_all", "close_all",
    "Policy", "register", "get_policy", "policy_names",
    "PydfcclError", "DeadlockError", "AbortedError", "RankFailedError",
]
__version__ = "0.1.0"

_configure_logging()
