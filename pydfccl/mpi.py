"""Ranks started one process each by ``mpiexec`` or by a torchrun-style launcher.

A *group* is what the bootstrap needs of the processes: ``rank``, ``size``, ``bcast``,
``allgather`` and ``Barrier``. Two groups are supported:
- an mpi4py communicator, used by ``Communicator.from_mpi(comm)``;
- a ``pydfccl.store.StoreGroup``, used by ``Communicator.from_env()``. It reads RANK,
  WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and rank 0 serves a loopback store.

The registrations that ``start()`` compares travel by ``allgather``. The memory the ranks
share is made by rank 0 and attached by the others:
- under the simulator, shared-memory segments, whose names rank 0 broadcasts;
- on GPUs, device memory through CUDA IPC (issue 6), which is not built yet.

``run_in_group`` runs one worker per process, as ``launch`` does, and gives rank 0 every
rank's result. ``python -m pydfccl demo`` uses it when it finds itself in such a job.
"""

from __future__ import annotations

import ctypes
import os
import traceback
from multiprocessing import resource_tracker, shared_memory

import numpy as np

__all__ = ["in_mpi_job", "current_group", "use_simulator_without_gpu",
           "communicator_from_group", "run_in_group"]

# Set by the launchers of MPICH (Hydra) and Open MPI in every process they start.
_MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


def in_mpi_job() -> bool:
    """Whether this process was started by ``mpiexec`` as one of several ranks."""
    return any(int(os.environ.get(v, "1")) > 1 for v in _MPI_SIZE_VARIABLES)


def current_group():
    """The group this process belongs to: MPI's world under ``mpiexec``, a store group
    under torchrun-style variables, else None (a plain process)."""
    from .store import StoreGroup, in_env_job

    if in_mpi_job():
        from mpi4py import MPI
        return MPI.COMM_WORLD
    if in_env_job():
        return StoreGroup()
    return None


def use_simulator_without_gpu() -> None:
    """In a job of one process per rank on a machine without a CUDA driver, run the kernels
    on the simulator: each process is a rank, as the simulator backend wants. It must run
    before Numba is imported (``pydfccl/__init__.py`` calls it first)."""
    from .store import in_env_job

    if "NUMBA_ENABLE_CUDASIM" in os.environ or not (in_mpi_job() or in_env_job()):
        return
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _shared_world(group, config):
    """The World of this rank: rank 0 makes the segments, the others attach to them; rank 0
    unlinks them once everyone has, so that nothing is left behind however the job ends."""
    from .world import World

    names = None
    if group.rank == 0:
        made = [shared_memory.SharedMemory(create=True, size=size)
                for size in (config.ctl_bytes, config.nranks * config.pool_bytes)]
        names = [s.name for s in made]
    names = group.bcast(names, root=0)
    if group.rank == 0:
        segments = made
    else:
        segments = [shared_memory.SharedMemory(name=name) for name in names]
        for s in segments:   # the creator owns the cleanup
            resource_tracker.unregister(s._name, "shared_memory")
    group.Barrier()
    if group.rank == 0:
        for s in segments:
            s.unlink()
    ctl, pools = (np.ndarray((s.size,), np.uint8, buffer=s.buf) for s in segments)
    world = World(config, ctl_mem=ctl[: config.ctl_bytes],
                  pool_mem=pools[: config.nranks * config.pool_bytes])
    world._segments = segments    # the mappings live as long as the world
    return world


def communicator_from_group(group, *, policy="dfccl", watchdog_timeout=None,
                            persistent: bool = True, **sizes):
    """This process's Communicator in a world of ``group.size`` ranks."""
    from . import platform
    from .communicator import Communicator
    from .errors import PydfcclError
    from .world import WorldConfig

    if not platform.SIMULATOR:
        raise PydfcclError(
            "a communicator per process on GPUs needs CUDA IPC between the rank processes, "
            "which is not implemented yet; on a machine without a GPU it runs the simulator "
            "(set NUMBA_ENABLE_CUDASIM=1 to force it)")
    config = WorldConfig(group.size, simulator=True, **sizes)
    world = _shared_world(group, config)
    return Communicator(world, group.rank, policy=policy, exchange=group.allgather,
                        watchdog_timeout=watchdog_timeout, persistent=persistent)


def run_in_group(worker, group, *, args=(), policy="dfccl", watchdog_timeout=None, **sizes):
    """Run ``worker(comm, *args)`` on this process's rank of ``group``. Rank 0 gets every
    rank's result in rank order and raises ``RankFailedError`` for the rank where a failure
    started; the other ranks get None. A failing rank aborts the others through the shared
    control rows, so that they do not wait for it."""
    from .launch import _raise_first

    outcome = None
    comm = None
    try:
        comm = communicator_from_group(group, policy=policy,
                                       watchdog_timeout=watchdog_timeout, **sizes)
        with comm:
            outcome = ("result", worker(comm, *args))
    except Exception as exc:
        if comm is not None and not comm.world.ctl["abort"].any():
            comm.world.set_report(f"rank {group.rank} failed: {type(exc).__name__}: {exc}")
            comm.world.abort_all()
        outcome = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    gathered = group.allgather(outcome)
    if group.rank != 0:
        return None
    failures = {r: (None, text) for r, (kind, text) in enumerate(gathered) if kind == "error"}
    if failures:
        _raise_first(failures)    # the rank where it started, not one aborted because of it
    return [payload for _, payload in gathered]
