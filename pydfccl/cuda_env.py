"""CUDA's environment variables that pydfccl sets before CUDA starts in a process.

CUDA reads them once, when it starts, so ``import pydfccl`` sets them (each only where the
user has not) before anything in the process can start it.

- ``CUDA_MODULE_LOADING=EAGER``: CUDA loads a kernel's code at its first launch by default
  (since CUDA 12.2), and such a load may wait for the whole device, a spinning daemon or a
  peer's kernel included, while they wait for a collective that the loading rank has yet
  to issue. With every kernel loaded when the context is made, no launch waits for one.
- ``CUDA_DEVICE_MAX_CONNECTIONS=32`` in a process that may drive several ranks (threads of
  one process): streams beyond the hardware work queues (CUDA's default 8) share queues,
  and work queued behind a kernel that spins for a peer waits with it; four rank threads
  under MPS deadlocked so (a kernel launched per collective, as NCCL does). A process that
  is one rank of a job (``mpiexec``, torchrun's variables, ``launch``'s rank processes)
  keeps CUDA's default: eight such processes under MPS with 32 queues each exhausted MPS's
  connections (``CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED`` on an H100; four torch ranks got
  "out of memory" from ``torch.cuda.set_device``). The choice is marked in the environment
  (``PYDFCCL_CHOSE_WORK_QUEUES``), so a rank started by any launcher from a process that
  imported pydfccl (``spawn_ranks``, ``mpiexec`` or ``torchrun`` run by a test) drops the
  inherited count, while one the user set stays.
"""

from __future__ import annotations

import os

__all__ = ["WORK_QUEUES", "CHOSEN_MARK", "set_before_cuda", "chose_work_queues",
           "one_rank_per_process"]

WORK_QUEUES = "CUDA_DEVICE_MAX_CONNECTIONS"
CHOSEN_MARK = "PYDFCCL_CHOSE_WORK_QUEUES"   # holds the count pydfccl set, for child processes
_RANK_THREADS_QUEUES = "32"        # the most CUDA allows
_chose_work_queues = False


def set_before_cuda() -> None:
    """Set the variables above that the user has not (``import pydfccl`` calls it)."""
    from .bootstrap.mpi import in_mpi_job
    from .bootstrap.store import in_env_job

    global _chose_work_queues
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")
    if in_mpi_job() or in_env_job():
        one_rank_per_process(_inherited_choice())
    elif WORK_QUEUES not in os.environ or _inherited_choice():
        os.environ[WORK_QUEUES] = os.environ[CHOSEN_MARK] = _RANK_THREADS_QUEUES
        _chose_work_queues = True


def _inherited_choice(environ=os.environ) -> bool:
    """Whether the work-queue count came from a pydfccl parent's choice (marked, unchanged)."""
    return CHOSEN_MARK in environ and environ.get(WORK_QUEUES) == environ[CHOSEN_MARK]


def chose_work_queues() -> bool:
    """Whether this process's work-queue count is pydfccl's choice, not the user's."""
    return _chose_work_queues


def one_rank_per_process(parent_chose: bool, environ=os.environ) -> None:
    """In a process that is one rank, before CUDA starts: the count a pydfccl parent chose
    for rank threads (inherited with the environment) goes back to CUDA's default; one the
    user set stays."""
    if parent_chose:
        environ.pop(WORK_QUEUES, None)
    environ.pop(CHOSEN_MARK, None)
