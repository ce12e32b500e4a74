"""Ranks started one process each by ``mpiexec`` or by a torchrun-style launcher.

A *group* is what the bootstrap needs of the processes: ``rank``, ``size``, ``bcast``,
``allgather`` and ``Barrier``. Two groups are supported:
- an mpi4py communicator, used by ``Communicator.from_mpi(comm)``;
- a ``pydfccl.bootstrap.store.StoreGroup`` (or, under torchrun, its agent's store:
  ``bootstrap/c10d.py``), used by ``Communicator.from_env()``. It reads RANK,
  WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and rank 0 serves a loopback store.

The registrations that ``start()`` compares travel by ``allgather``. The control rows are
a shared-memory segment per node that the node's lowest rank makes and the others attach
to (its name travels by ``allgather``). The pools:
- under the simulator, a second shared-memory segment per node;
- on GPUs, device memory that each process allocates on its GPU (chosen by its local rank
  among the host's GPUs) and exports to the others as a CUDA IPC handle. Processes that
  share one GPU need the MPS daemon to run their kernels side by side; without it each
  rank logs a warning once.

Ranks on other nodes (``topology``; emulated with ``PYDFCCL_RANKS_PER_NODE``) are reached
through the network proxy (``pydfccl.transport``) on a ``Dup`` of the MPI communicator; a
job across hosts without MPI is refused with ``SpansHostsError``.

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


def _shared_world(group, config, nodes: list[int]):
    """The World of this rank: the lowest rank of each node makes its node's segments, the
    others attach to them; it unlinks them once everyone has, so that nothing is left
    behind however the job ends. Ranks on other nodes get shadows (``World``)."""
    from ..host.world import World
    from ..host.world_config import new_segment

    sizes = [config.ctl_bytes] + ([config.nranks * config.pool_bytes] if config.simulator else [])
    leader = nodes.index(nodes[group.rank])
    made = [new_segment(size) for size in sizes] if group.rank == leader else None
    names = group.allgather([s.name for s in made] if made else None)[leader]
    if made:
        segments = made
    else:
        segments = [shared_memory.SharedMemory(name=name) for name in names]
        for s in segments:   # the creator owns the cleanup
            resource_tracker.unregister(s._name, "shared_memory")
    group.Barrier()
    if made:
        for s in segments:
            s.unlink()
    views = [np.ndarray((size,), np.uint8, buffer=s.buf) for s, size in zip(segments, sizes)]
    where = dict(keep=tuple(segments), nodes=nodes, nodes_of=group.rank)
    if config.simulator:
        return World(config, ctl_mem=views[0], pool_mem=views[1], **where)
    return World(config, ctl_mem=views[0], ipc=(group.rank, group.allgather), **where)


def _start_proxy(group, world) -> None:
    """The network proxy of a world whose ranks span nodes, on a communicator of its own
    (a collective ``Dup``: every rank of such a world has a peer on another node)."""
    from mpi4py import MPI

    from .. import platform
    from ..log import logger
    from ..transport.proxy import NetProxy
    from .topology import ring_crossings

    crossings, fewest = ring_crossings(world.nodes)
    if crossings > fewest and group.rank == 0:
        logger.warning("the ring of ranks 0, 1, ..., %d crosses between nodes %d times where "
                       "%d would do: place each node's ranks in a block (mpiexec -ppn K) so "
                       "that collectives cross the network less", group.size - 1, crossings,
                       fewest)
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise RuntimeError("the network proxy needs MPI_THREAD_MULTIPLE (mpi4py asks for it "
                           "unless mpi4py.rc.thread_level says otherwise)")
    world.net = NetProxy(world, group.rank, group.Dup(),
                         idle_sleep=5e-4 if platform.backend.kernels_on_host else 2e-5)
    world.net.start()


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
    """This process's Communicator in a world of ``group.size`` ranks, on one host or,
    under MPI, on several (``topology.check_one_host``). Unless ``sizes`` gives ``nblocks``, a GPU daemon takes
    its share of the GPU's resident blocks among the ranks on the busiest GPU of the job,
    each with ``daemons_per_rank`` communicators' daemons (torch's process groups: several
    per rank)."""
    from .. import platform
    from ..host.communicator import Communicator
    from ..host.world_config import WorldConfig, gpu_nblocks
    from ..kernels.limits import MAX_THREADS
    from .topology import check_one_host, node_indices, over_mpi, rank_hosts

    hosts = rank_hosts(group)
    check_one_host(hosts, network=over_mpi(group))   # before anything is shared, everywhere
    if not platform.backend.kernels_on_host:     # kernels on a GPU: each rank picks one
        on_gpu = choose_gpu(group)
        if sizes.get("nblocks") is None:
            sizes["nblocks"] = gpu_nblocks(on_gpu * daemons_per_rank,
                                           sizes.get("nthreads") or MAX_THREADS)
    config = WorldConfig(group.size, **sizes)
    world = _shared_world(group, config, node_indices(hosts))
    if world.remote:
        _start_proxy(group, world)
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
            try:
                outcome = ("result", worker(comm, *args))
            except Exception as exc:    # before close: the proxy still carries the report
                comm.world.abort_with(f"rank {group.rank} failed: {type(exc).__name__}: "
                                      f"{exc}")
                raise
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
