"""``pydfccl.launch``: run ``worker(comm)`` once per rank and gather the results.

Backends:

* ``"threads"``: ranks are threads of this process on one GPU, each with its own stream and
  daemon (the fast single-GPU path).
* ``"processes"``: one process per rank. Without a GPU they run the CUDA simulator, peer
  memory in shared-memory segments (the CPU-only path; CI uses it). With GPUs each process
  takes one (rank modulo the GPUs present) and reaches its peers' pools through CUDA IPC;
  processes that share a GPU need the MPS daemon (``pydfccl.bootstrap.mpi.choose_gpu`` warns).

``PYDFCCL_BACKEND`` overrides the default choice (threads with a GPU, else processes).

An exception in any rank is raised here as :class:`RankFailedError` naming the rank; the
other ranks are aborted rather than left waiting for it, and a rank process that dies is
reported the same way.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from .. import cuda_start
from ..errors import PydfcclError
from .failures import raise_first

__all__ = ["launch", "BACKENDS", "default_backend"]

BACKENDS = ("threads", "processes")


def default_backend() -> str:
    chosen = os.environ.get("PYDFCCL_BACKEND")
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"PYDFCCL_BACKEND={chosen!r}; choose from {BACKENDS}")
        return chosen
    from ..host.world_config import on_gpu

    return "threads" if on_gpu() else "processes"


def launch(worker, nranks: int, *, policy="dfccl", backend: str | None = None,
           timeout: float | None = None, watchdog_timeout: float | None = None,
           args: tuple = (), persistent: bool = True, **config) -> list:
    """Run ``worker(comm, *args)`` on ``nranks`` ranks; return the results in rank order.

    ``config`` overrides :class:`WorldConfig` sizes (nblocks, nthreads, nslots, slot_bytes,
    max_colls). ``timeout`` bounds the whole job (seconds), and a stall that may still end
    (a late rank) fails only then (600 s when None, as torch's default). ``watchdog_timeout``
    is the stall time after which the ranks report who waits on whom, and fail at once with
    a deadlock report if the stall is proven one (a wait-for cycle under a policy that never
    preempts, such as ``nccl``). A dead rank fails its peers at once.
    ``persistent=False`` launches a kernel per collective instead of a daemon (a baseline).
    """
    options = dict(policy=policy, watchdog_timeout=watchdog_timeout, persistent=persistent,
                   timeout=timeout)
    if not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be a positive int, got {nranks!r}")
    if (backend or os.environ.get("PYDFCCL_BACKEND") or "threads") == "threads":
        # Ranks will be threads of this process if it has a GPU: its driver and context
        # start beside the import of the runtime (below, and not with this module).
        cuda_start.begin()
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    if backend == "threads":
        return _launch_threads(worker, nranks, options, timeout, args, config)
    from .processes import launch_processes

    return launch_processes(worker, nranks, options, timeout, args, config)


# -- ranks as threads -------------------------------------------------------------------------

class _ThreadExchange:
    """All-gather among rank threads (what start() needs to compare signatures). A rank
    that has ended (``leave``) breaks the exchanges its peers are in or enter, naming it."""

    def __init__(self, nranks: int, start_timeout: float):
        self.start_timeout = start_timeout
        self.slots = [None] * nranks
        self.barrier = threading.Barrier(nranks)
        self.gone: dict = {}

    def leave(self, rank: int, how: str) -> None:
        self.gone[rank] = how
        self.barrier.abort()

    def for_rank(self, rank: int):
        def exchange(obj):
            self.slots[rank] = obj
            try:
                self.barrier.wait(self.start_timeout)
                result = list(self.slots)
                self.barrier.wait(self.start_timeout)
            except threading.BrokenBarrierError:
                why = ", ".join(f"rank {r} {how}" for r, how in sorted(self.gone.items()))
                within = f"not all within {self.start_timeout:.0f} s"
                raise PydfcclError("not every rank arrived in the exchange (start(), "
                                   f"barrier()): {why or within}") from None
            return result

        return exchange


def _launch_threads(worker, nranks, options, timeout, args, config):
    from .. import platform
    from ..host.communicator import Communicator
    from ..host.world import World
    from ..host.world_config import WorldConfig
    from .processes import START_TIMEOUT

    if platform.backend.one_kernel_per_process:
        raise PydfcclError("the threads backend needs a GPU: the simulator runs one kernel per "
                           "process; use backend='processes'")
    platform.backend.open_context()
    world = World(WorldConfig(nranks, **config))
    exchange = _ThreadExchange(nranks, START_TIMEOUT)
    results, failures = [None] * nranks, {}

    def body(rank):
        try:
            with Communicator(world, rank, exchange=exchange.for_rank(rank), **options) as comm:
                results[rank] = worker(comm, *args)
            exchange.leave(rank, "returned")
        except BaseException as exc:
            failures[rank] = (exc, f"{type(exc).__name__}: {exc}")
            exchange.leave(rank, "failed")
            world.abort_with(f"rank {rank} failed: {failures[rank][1]}")

    threads = [threading.Thread(target=body, args=(r,), name=f"pydfccl-rank{r}", daemon=True)
               for r in range(nranks)]
    # Ranks, pollers and launchers are all Python threads of this process: switch between
    # them every 50 us rather than every 5 ms while they run.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, 5e-5))
    try:
        for t in threads:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(switch)
    if any(t.is_alive() for t in threads):
        world.abort_with(f"launch timeout ({timeout} s) reached")   # what the ranks raise
        raise TimeoutError(f"launch: ranks {[r for r, t in enumerate(threads) if t.is_alive()]} "
                           f"still running after {timeout} s (aborted)")
    if failures:
        raise_first(failures)
    return results
