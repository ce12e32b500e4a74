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

import gc
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import sys
import threading
import time
import traceback
from multiprocessing import shared_memory

import numpy as np

from ..protocol import layout as L
from .. import platform
from ..host.communicator import Communicator
from ..errors import PydfcclError, RankFailedError
from ..host.world import World, WorldConfig, new_segment

__all__ = ["launch", "BACKENDS", "default_backend"]

BACKENDS = ("threads", "processes")
START_TIMEOUT = 120.0   # how long start() waits for every rank to arrive


def default_backend() -> str:
    chosen = os.environ.get("PYDFCCL_BACKEND")
    if chosen:
        if chosen not in BACKENDS:
            raise ValueError(f"PYDFCCL_BACKEND={chosen!r}; choose from {BACKENDS}")
        return chosen
    return "threads" if platform.gpu_available() else "processes"


def launch(worker, nranks: int, *, policy="dfccl", backend: str | None = None,
           timeout: float | None = None, watchdog_timeout: float | None = None,
           args: tuple = (), persistent: bool = True, **config) -> list:
    """Run ``worker(comm, *args)`` on ``nranks`` ranks; return the results in rank order.

    ``config`` overrides :class:`WorldConfig` sizes (nblocks, nthreads, nslots, slot_bytes,
    max_colls). ``timeout`` bounds the whole job (seconds); ``watchdog_timeout`` is the
    stall time after which outstanding collectives fail with a deadlock report.
    ``persistent=False`` launches a kernel per collective instead of a daemon (a baseline).
    """
    options = dict(policy=policy, watchdog_timeout=watchdog_timeout, persistent=persistent)
    backend = backend or default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {BACKENDS}")
    if not isinstance(nranks, int) or nranks < 1:
        raise ValueError(f"nranks must be a positive int, got {nranks!r}")
    if backend == "threads":
        return _launch_threads(worker, nranks, options, timeout, args, config)
    return _launch_processes(worker, nranks, options, timeout, args, config)


def _raise_first(failures: dict) -> None:
    """Raise for the rank that failed first in cause, not a peer that only saw the abort."""
    consequences = ("DeadlockError", "AbortedError", "not every rank arrived")
    origin = [r for r, (_, text) in failures.items()
              if not any(c in text.splitlines()[0] for c in consequences)]
    rank = min(origin or failures)
    exc, text = failures[rank]
    raise RankFailedError(rank, text) from exc


# -- ranks as threads -------------------------------------------------------------------------

class _ThreadExchange:
    """All-gather among rank threads (what start() needs to compare signatures)."""

    def __init__(self, nranks: int):
        self.slots = [None] * nranks
        self.barrier = threading.Barrier(nranks)

    def for_rank(self, rank: int):
        def exchange(obj):
            self.slots[rank] = obj
            try:
                self.barrier.wait(START_TIMEOUT)
                result = list(self.slots)
                self.barrier.wait(START_TIMEOUT)
            except threading.BrokenBarrierError:
                raise PydfcclError("start(): not every rank arrived (a peer failed or did not "
                                   f"call start() within {START_TIMEOUT:.0f} s)") from None
            return result

        return exchange


def _launch_threads(worker, nranks, options, timeout, args, config):
    if platform.backend.one_kernel_per_process:
        raise PydfcclError("the threads backend needs a GPU: the simulator runs one kernel per "
                           "process; use backend='processes'")
    world = World(WorldConfig(nranks, **config))
    exchange = _ThreadExchange(nranks)
    results, failures = [None] * nranks, {}

    def body(rank):
        try:
            with Communicator(world, rank, exchange=exchange.for_rank(rank), **options) as comm:
                results[rank] = worker(comm, *args)
        except BaseException as exc:
            failures[rank] = (exc, f"{type(exc).__name__}: {exc}")
            exchange.barrier.abort()
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
        world.abort_all()
        raise TimeoutError(f"launch: ranks {[r for r, t in enumerate(threads) if t.is_alive()]} "
                           f"still running after {timeout} s (aborted)")
    if failures:
        _raise_first(failures)
    return results


# -- one process per rank -------------------------------------------------------------

class _PipeGroup:
    """A rank process's view of its peers for the bootstrap: an all-gather through the
    launching parent."""

    def __init__(self, rank: int, size: int, pipe):
        self.rank, self.size, self._pipe = rank, size, pipe

    def allgather(self, obj):
        self._pipe.send(("exchange", obj))
        kind, payload = self._pipe.recv()
        if kind != "exchange":
            raise PydfcclError(f"exchange with the other ranks failed: {payload}")
        return payload


def _rank_process(rank, config, shm_names, options, worker, pipe, args):
    from .mpi import choose_gpu

    cfg = WorldConfig(**config)
    group = _PipeGroup(rank, cfg.nranks, pipe)
    segments = [shared_memory.SharedMemory(name=name) for name in shm_names]
    ctl, *pools = [np.ndarray((s.size,), np.uint8, buffer=s.buf) for s in segments]
    try:
        if cfg.simulator:
            world = World(cfg, ctl_mem=ctl[:cfg.ctl_bytes],
                          pool_mem=pools[0][:cfg.nranks * cfg.pool_bytes])
        else:
            choose_gpu(group, local=rank)   # not LOCAL_RANK: this launcher's own
            world = World(cfg, ctl_mem=ctl[:cfg.ctl_bytes], ipc=(rank, group.allgather))
        del ctl, pools
        with Communicator(world, rank, exchange=group.allgather, **options) as comm:
            result = worker(comm, *args)
        pipe.send(("result", result))
    except BaseException as exc:
        detail = "".join(traceback.format_exception(exc)).rstrip()
        pipe.send(("error", f"{type(exc).__name__}: {exc}\n{detail}"))
    finally:
        comm = world = None
        gc.collect()
        for shm in segments:
            try:
                shm.close()
            except BufferError:
                pass  # a view is still referenced (e.g. by a worker's result); exit frees it


def _launch_processes(worker, nranks, options, timeout, args, config):
    simulator = not platform.gpu_available()
    config = dict(WorldConfig(nranks, simulator=simulator, **config).as_dict())
    cfg = WorldConfig(**config)
    if simulator:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    ctx = mp.get_context("spawn")
    ctl_shm = new_segment(cfg.ctl_bytes)
    segments = [ctl_shm] + ([new_segment(nranks * cfg.pool_bytes)] if simulator else [])
    procs, pipes = [], []
    try:
        for rank in range(nranks):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_rank_process, name=f"pydfccl-rank{rank}",
                            args=(rank, config, [s.name for s in segments], options, worker,
                                  child_end, args))
            p.start()
            child_end.close()
            procs.append(p)
            pipes.append(parent_end)
        return _supervise(procs, pipes, ctl_shm, cfg, timeout)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for shm in segments:
            shm.close()
            shm.unlink()


def _abort_segment(ctl_shm, cfg, report: str) -> None:
    """Abort every rank through the shared control rows, leaving ``report`` for them."""
    view = np.ndarray((cfg.ctl_bytes,), np.uint8, buffer=ctl_shm.buf)
    rows = view[: cfg.nranks * L.CTL_ROW.itemsize].view(L.CTL_ROW)
    report_area = view[cfg.nranks * L.CTL_ROW.itemsize:]
    if not rows["abort"].any():
        raw = report.encode()[: report_area.size - 1]
        report_area[: len(raw)] = np.frombuffer(raw, np.uint8)
        report_area[len(raw)] = 0
    rows["abort"][:] = 1
    del rows, report_area, view


def _supervise(procs, pipes, ctl_shm, cfg, timeout):
    n = len(procs)
    results, failures, exchange = [None] * n, {}, {}
    finished = set()
    deadline = None if timeout is None else time.monotonic() + timeout
    while len(finished) < n:
        if deadline is not None and time.monotonic() > deadline:
            _abort_segment(ctl_shm, cfg, f"launch timeout ({timeout} s) reached")
            for p in procs:
                p.kill()
            raise TimeoutError(f"launch: ranks {sorted(set(range(n)) - finished)} still running "
                               f"after {timeout} s (killed)")
        ready = mpc.wait([pp for r, pp in enumerate(pipes) if r not in finished]
                         + [p.sentinel for r, p in enumerate(procs) if r not in finished], 0.1)
        for r in range(n):
            if r in finished:
                continue
            pipe = pipes[r]
            dead = False
            if pipe in ready or pipe.poll():
                try:
                    kind, payload = pipe.recv()
                except EOFError:        # the process is gone (its end of the pipe closed)
                    kind, payload, dead = None, None, True
                if kind == "exchange":
                    exchange[r] = payload
                    if len(exchange) == n:
                        gathered = [exchange[i] for i in range(n)]
                        for i in range(n):
                            pipes[i].send(("exchange", gathered))
                        exchange.clear()
                    continue
                if kind == "result":
                    results[r] = payload
                    finished.add(r)
                    continue
                if kind == "error":
                    failures[r] = (None, payload)
                    finished.add(r)
                    _abort_segment(ctl_shm, cfg, f"rank {r} failed: {payload.splitlines()[0]}")
                    _release_exchange(pipes, exchange, f"rank {r} failed")
                    continue
            if dead or procs[r].sentinel in ready or not procs[r].is_alive():
                if not dead and pipe.poll():
                    continue  # read its last message first
                procs[r].join(timeout=1)
                message = f"process died with exit code {procs[r].exitcode}"
                failures[r] = (None, message)
                finished.add(r)
                _abort_segment(ctl_shm, cfg, f"rank {r} {message}")
                _release_exchange(pipes, exchange, f"rank {r} died")
    if failures:
        _raise_first(failures)
    return results


def _release_exchange(pipes, exchange, why: str) -> None:
    for r in list(exchange):
        pipes[r].send(("abort", why))
    exchange.clear()
