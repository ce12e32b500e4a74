"""Ranks started one process each by ``mpiexec`` or by a torchrun-style launcher.

A *group* is what the bootstrap needs of the processes: ``rank``, ``size``, ``bcast``,
``allgather`` and ``Barrier``. Two groups are supported:
- an mpi4py communicator, used by ``Communicator.from_mpi(comm)``;
- a ``pydfccl.bootstrap.store.StoreGroup`` (or, under torchrun, its agent's store:
  ``bootstrap/c10d.py``), used by ``Communicator.from_env()``. It reads RANK,
  WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and rank 0 serves a loopback store.

The registrations that ``start()`` compares travel by ``allgather``. The control rows are
a shared-memory segment that rank 0 makes and the others attach to (rank 0 broadcasts its
name). The pools:
- under the simulator, a second shared-memory segment;
- on GPUs, device memory that each process allocates on its GPU (chosen by its local rank
  among the host's GPUs) and exports to the others as a CUDA IPC handle. Processes that
  share one GPU need the MPS daemon to run their kernels side by side; without it each
  rank logs a warning once.

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
    from .store import env_group, in_env_job

    if in_mpi_job():
        from mpi4py import MPI
        return MPI.COMM_WORLD
    if in_env_job():
        return env_group()
    return None


def use_simulator_without_gpu() -> None:
    """On a machine without a CUDA driver, run the kernels on the simulator, whatever
    started the process (mpiexec, torchrun, ``torch.multiprocessing.spawn`` with ranks
    given in code, or nothing): without a driver nothing else can run them. It must run
    before Numba is imported (``pydfccl/__init__.py`` calls it first)."""
    if "NUMBA_ENABLE_CUDASIM" in os.environ:
        return
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def _shared_world(group, config):
    """The World of this rank: rank 0 makes the segments, the others attach to them; rank 0
    unlinks them once everyone has, so that nothing is left behind however the job ends."""
    from ..host.world import World, new_segment

    sizes = [config.ctl_bytes] + ([config.nranks * config.pool_bytes] if config.simulator else [])
    names = None
    if group.rank == 0:
        made = [new_segment(size) for size in sizes]
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
    views = [np.ndarray((size,), np.uint8, buffer=s.buf) for s, size in zip(segments, sizes)]
    if config.simulator:
        return World(config, ctl_mem=views[0], pool_mem=views[1], keep=tuple(segments))
    return World(config, ctl_mem=views[0], ipc=(group.rank, group.allgather),
                 keep=tuple(segments))


LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "PMI_LOCAL_RANK", "SLURM_LOCALID")


def local_rank(group) -> int:
    """This process's index among the job's processes on this host (as launchers set it),
    else its rank: it picks the GPU."""
    for name in LOCAL_RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return group.rank


def choose_gpu(group, local: int | None = None) -> int:
    """Put this rank on a GPU of its host (by ``local``, default its local rank), and warn
    when ranks share one without MPS. Returns the most ranks any GPU of the job holds (the
    same on every rank), which sizes the daemons so that all of them fit at once."""
    import socket

    from .. import platform
    from ..log import logger

    device = platform.use_device(local_rank(group) if local is None else local)
    placed = group.allgather((socket.gethostname(), device))
    sharing = [r for r, where in enumerate(placed) if where == placed[group.rank]]
    if len(sharing) > 1 and not platform.mps_active():
        logger.warning(
            "rank %d: ranks %s share GPU %d without the MPS daemon, so their daemon kernels "
            "take turns in time slices (one handshake took 4.8 ms instead of 36 us on an "
            "H200); start it with `nvidia-cuda-mps-control -d`", group.rank, sharing, device)
    return max(placed.count(where) for where in placed)


def communicator_from_group(group, *, policy="dfccl", watchdog_timeout=None,
                            persistent: bool = True, daemons_per_rank: int = 1,
                            timeout: float | None = None, **sizes):
    """This process's Communicator in a world of ``group.size`` ranks, all on one host
    (``topology.check_one_host``). Unless ``sizes`` gives ``nblocks``, a GPU daemon takes
    its share of the GPU's resident blocks among the ranks on the busiest GPU of the job,
    each with ``daemons_per_rank`` communicators' daemons (torch's process groups: several
    per rank)."""
    from .. import platform
    from ..host.communicator import Communicator
    from ..host.world import MAX_THREADS, WorldConfig, gpu_nblocks
    from .topology import check_one_host, rank_hosts

    check_one_host(rank_hosts(group))   # before anything is shared: the same on every rank
    if not platform.backend.kernels_on_host:     # kernels on a GPU: each rank picks one
        on_gpu = choose_gpu(group)
        if sizes.get("nblocks") is None:
            sizes["nblocks"] = gpu_nblocks(on_gpu * daemons_per_rank,
                                           sizes.get("nthreads") or MAX_THREADS)
    config = WorldConfig(group.size, **sizes)
    world = _shared_world(group, config)
    return Communicator(world, group.rank, policy=policy, exchange=group.allgather,
                        watchdog_timeout=watchdog_timeout, persistent=persistent,
                        timeout=timeout)


def run_in_group(worker, group, *, args=(), policy="dfccl", watchdog_timeout=None, **sizes):
    """Run ``worker(comm, *args)`` on this process's rank of ``group``. Rank 0 gets every
    rank's result in rank order and raises ``RankFailedError`` for the rank where a failure
    started; the other ranks get None. A failing rank aborts the others through the shared
    control rows, so that they do not wait for it."""
    from .failures import raise_first

    outcome = None
    comm = None
    try:
        comm = communicator_from_group(group, policy=policy,
                                       watchdog_timeout=watchdog_timeout, **sizes)
        with comm:
            outcome = ("result", worker(comm, *args))
    except Exception as exc:
        if comm is not None:
            comm.world.abort_with(f"rank {group.rank} failed: {type(exc).__name__}: "
                                  f"{exc}")
        outcome = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    gathered = group.allgather(outcome)
    if group.rank != 0:
        return None
    failures = {r: (None, text) for r, (kind, text) in enumerate(gathered) if kind == "error"}
    if failures:
        raise_first(failures)     # the rank where it started, not one aborted because of it
    return [payload for _, payload in gathered]
