"""Ranks that ``mpiexec`` started: one process per rank, bootstrapped through mpi4py.

``Communicator.from_mpi(comm)`` makes this process's communicator. The registrations that
``start()`` compares travel by ``allgather``. The memory the ranks share is made by rank 0
and attached by the others:
- under the simulator, shared-memory segments, whose names rank 0 broadcasts;
- on GPUs, device memory through CUDA IPC (issue 6), which is not built yet.

``run_under_mpi`` runs one worker per process as ``launch`` does and gathers the results on
rank 0; ``python -m pydfccl demo`` uses it when it finds itself under ``mpiexec``.
"""

from __future__ import annotations

import ctypes
import os
import traceback
from multiprocessing import resource_tracker, shared_memory

import numpy as np

__all__ = ["in_mpi_job", "use_simulator_without_gpu", "communicator_from_mpi",
           "run_under_mpi"]

# Set by the launchers of MPICH (Hydra) and Open MPI in every process they start.
_MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


def in_mpi_job() -> bool:
    """Whether this process was started by ``mpiexec`` as one of several ranks."""
    return any(int(os.environ.get(v, "1")) > 1 for v in _MPI_SIZE_VARIABLES)


def use_simulator_without_gpu() -> None:
    """Under ``mpiexec`` on a machine without a CUDA driver, run the kernels on the
    simulator: each MPI process is a rank, as the simulator backend wants. It must run
    before Numba is imported (``pydfccl/__init__.py`` calls it first)."""
    if "NUMBA_ENABLE_CUDASIM" in os.environ or not in_mpi_job():
        return
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _shared_world(mpi_comm, config):
    """The World of this rank: rank 0 makes the segments, the others attach to them; rank 0
    unlinks them once everyone has, so that nothing is left behind however the job ends."""
    from .world import World

    names = None
    if mpi_comm.rank == 0:
        made = [shared_memory.SharedMemory(create=True, size=size)
                for size in (config.ctl_bytes, config.nranks * config.pool_bytes)]
        names = [s.name for s in made]
    names = mpi_comm.bcast(names, root=0)
    if mpi_comm.rank == 0:
        segments = made
    else:
        segments = [shared_memory.SharedMemory(name=name) for name in names]
        for s in segments:   # the creator owns the cleanup
            resource_tracker.unregister(s._name, "shared_memory")
    mpi_comm.Barrier()
    if mpi_comm.rank == 0:
        for s in segments:
            s.unlink()
    ctl, pools = (np.ndarray((s.size,), np.uint8, buffer=s.buf) for s in segments)
    world = World(config, ctl_mem=ctl[: config.ctl_bytes],
                  pool_mem=pools[: config.nranks * config.pool_bytes])
    world._segments = segments    # the mappings live as long as the world
    return world


def communicator_from_mpi(mpi_comm, *, policy="dfccl", watchdog_timeout=None,
                          persistent: bool = True, **sizes):
    """This process's Communicator in a world of ``mpi_comm.size`` ranks."""
    from . import platform
    from .communicator import Communicator
    from .errors import PydfcclError
    from .world import WorldConfig

    if not platform.SIMULATOR:
        raise PydfcclError(
            "Communicator.from_mpi on GPUs needs CUDA IPC between the rank processes, which "
            "is not implemented yet; on a machine without a GPU it runs the simulator "
            "(set NUMBA_ENABLE_CUDASIM=1 to force it)")
    config = WorldConfig(mpi_comm.size, simulator=True, **sizes)
    world = _shared_world(mpi_comm, config)
    return Communicator(world, mpi_comm.rank, policy=policy, exchange=mpi_comm.allgather,
                        watchdog_timeout=watchdog_timeout, persistent=persistent)


def run_under_mpi(worker, *, args=(), policy="dfccl", watchdog_timeout=None, **sizes):
    """Run ``worker(comm, *args)`` on this MPI process's rank. Rank 0 gets every rank's
    result in rank order and raises ``RankFailedError`` for the first rank that failed;
    the other ranks get None. A failing rank aborts the others through the shared control
    rows, so that they do not wait for it."""
    from mpi4py import MPI

    from .launch import _raise_first

    mpi_comm = MPI.COMM_WORLD
    outcome = None
    comm = None
    try:
        comm = communicator_from_mpi(mpi_comm, policy=policy,
                                     watchdog_timeout=watchdog_timeout, **sizes)
        with comm:
            outcome = ("result", worker(comm, *args))
    except Exception as exc:
        if comm is not None and not comm.world.ctl["abort"].any():
            comm.world.set_report(f"rank {mpi_comm.rank} failed: {type(exc).__name__}: {exc}")
            comm.world.abort_all()
        outcome = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    gathered = mpi_comm.gather(outcome, root=0)
    if mpi_comm.rank != 0:
        return None
    failures = {r: (None, text) for r, (kind, text) in enumerate(gathered) if kind == "error"}
    if failures:
        _raise_first(failures)    # the rank where it started, not one aborted because of it
    return [payload for _, payload in gathered]
