"""One process per rank under ``pydfccl.launch``: the rank processes and their supervisor.

The launcher keeps the contract of torchrun and mpiexec:

- ranks die with it: a rank process asks the kernel to kill it when its parent dies
  (``PR_SET_PDEATHSIG``) and also watches its parent's pid;
- the shared-memory segments are unlinked as soon as every rank has attached, so a job
  killed whole (``timeout``, Slurm, Kubernetes: SIGKILL to the process group) leaves
  nothing in ``/dev/shm``;
- a rank that fails, dies, or returns while its peers wait for it in an exchange
  (``start()``, ``barrier()``) ends the job: the others get an error naming it at once, and
  whoever is still running ``GRACE_SECONDS`` later is killed;
- an exchange waits ``START_TIMEOUT`` for the ranks that have not arrived, then names them;
- ``launch()`` returns or raises within its ``timeout`` (plus the grace), and Ctrl-C ends the
  job at once: rank processes ignore SIGINT and leave the ending to their launcher.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing import shared_memory
from multiprocessing.reduction import ForkingPickler

import numpy as np

from ..cuda_env import chose_work_queues, one_rank_per_process
from ..errors import PydfcclError
from ..host.world_config import WorldConfig, new_segment, on_gpu
from ..protocol import layout as L
from .failures import raise_first

__all__ = ["launch_processes", "START_TIMEOUT", "GRACE_SECONDS"]

START_TIMEOUT = float(os.environ.get("PYDFCCL_START_TIMEOUT", "120"))
GRACE_SECONDS = 5.0
KILLED = "killed: still running after the job failed"   # a consequence, not a cause
PR_SET_PDEATHSIG = 1


# -- a rank process ---------------------------------------------------------------------

def _die_with_parent(parent: int) -> None:
    """End this process when its launcher ends: the kernel's parent-death signal on Linux,
    and everywhere a thread that sees the parent's pid go."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:        # it died before the signal was asked for
        os._exit(1)

    def watch():
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="pydfccl-parent-watch", daemon=True).start()


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


def _rank_process(rank, config, shm_names, options, worker, pipe, args, parent,
                  parent_chose_queues):
    one_rank_per_process(parent_chose_queues)     # before this process starts CUDA
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the launcher's to handle
    # Here, in the rank: the launcher needs none of these, nor the Numba they import.
    from ..host.communicator import Communicator
    from ..host.world import World
    from .mpi import choose_gpu

    cfg = WorldConfig(**config)
    group = _PipeGroup(rank, cfg.nranks, pipe)
    segments = [shared_memory.SharedMemory(name=name) for name in shm_names]
    pipe.send(("attached", None))
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


# -- the launcher's side ----------------------------------------------------------------

def _check_sendable(worker, options: dict, args: tuple) -> None:
    """Rank processes are spawned, so what they run travels pickled: a policy with a lambda
    among its functions, say, failed as a bare PicklingError inside ``Process.start``."""
    for what, obj in (("the policy", options["policy"]), ("the worker", worker),
                      ("the worker's arguments", args)):
        try:
            ForkingPickler.dumps(obj)
        except Exception as exc:
            raise ValueError(
                f"pydfccl.launch: {what} cannot be sent to rank processes, which are "
                f"spawned: its functions must be importable by name (defined at the top "
                f"level of a module, not lambdas or closures): {exc}") from None


def launch_processes(worker, nranks, options, timeout, args, config):
    _check_sendable(worker, options, args)
    simulator = not on_gpu()
    config = dict(WorldConfig(nranks, simulator=simulator, **config).as_dict())
    cfg = WorldConfig(**config)
    if simulator:
        os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
    ctx = mp.get_context("spawn")
    ctl_shm = new_segment(cfg.ctl_bytes)
    segments = [ctl_shm] + ([new_segment(nranks * cfg.pool_bytes)] if simulator else [])
    supervisor = _Supervisor(nranks, ctl_shm, cfg, segments, timeout)
    try:
        for rank in range(nranks):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_rank_process, name=f"pydfccl-rank{rank}",
                            args=(rank, config, [s.name for s in segments], options, worker,
                                  child_end, args, os.getpid(), chose_work_queues()))
            p.start()
            child_end.close()
            supervisor.add(p, parent_end)
        return supervisor.run()
    except KeyboardInterrupt:
        supervisor.abort("the launcher was interrupted (Ctrl-C)")
        raise KeyboardInterrupt("pydfccl.launch: interrupted; every rank stopped") from None
    finally:
        supervisor.end()


class _Supervisor:
    """Relays the exchanges of the rank processes and watches them end."""

    def __init__(self, n, ctl_shm, cfg, segments, timeout):
        self.n, self.ctl_shm, self.cfg, self.segments = n, ctl_shm, cfg, segments
        self.procs, self.pipes = [], []
        self.results, self.failures, self.exchange = [None] * n, {}, {}
        self.finished, self.attached = set(), set()
        self.gone: dict = {}      # rank -> "returned" or "failed", once it has ended
        self.exchange_since = None
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        self.kill_at = None
        self.unlinked = False

    def add(self, proc, pipe) -> None:
        self.procs.append(proc)
        self.pipes.append(pipe)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> list:
        while len(self.finished) < self.n:
            now = time.monotonic()
            if self.deadline is not None and now > self.deadline:
                self.abort(f"launch timeout ({self.timeout} s) reached")
                raise TimeoutError(f"launch: ranks {self.running()} still running after "
                                   f"{self.timeout} s (killed)")
            if self.kill_at is not None and now > self.kill_at:
                for r in self.running():
                    self.failures.setdefault(r, (None, KILLED))
                    self.finished.add(r)
                self.kill_all()
                break
            self._check_exchange(now)
            waiting = [pp for r, pp in enumerate(self.pipes) if r not in self.finished]
            waiting += [p.sentinel for r, p in enumerate(self.procs) if r not in self.finished]
            ready = mpc.wait(waiting, 0.1)
            for r in self.running():
                self._look_at(r, ready)
        if self.failures:
            raise_first(self.failures)
        return self.results

    def running(self) -> list:
        return [r for r in range(self.n) if r not in self.finished]

    def _look_at(self, r, ready) -> None:
        pipe, proc = self.pipes[r], self.procs[r]
        if pipe in ready or pipe.poll():
            try:
                kind, payload = pipe.recv()
            except EOFError:            # the process is gone (its end of the pipe closed)
                return self._died(r)
            if kind == "attached":
                self.attached.add(r)
                if len(self.attached) == self.n:
                    self.unlink()       # every rank has it mapped: nothing to leave behind
            elif kind == "exchange":
                self.exchange_since = self.exchange_since or time.monotonic()
                self.exchange[r] = payload
                if len(self.exchange) == self.n:
                    gathered = [self.exchange[i] for i in range(self.n)]
                    for i in range(self.n):
                        self.pipes[i].send(("exchange", gathered))
                    self.exchange.clear()
                    self.exchange_since = None
            elif kind == "result":
                self.results[r] = payload
                self.finished.add(r)
                self._gone(r, "returned")
            elif kind == "error":
                self._failed(r, payload)
            return
        if proc.sentinel in ready or not proc.is_alive():
            self._died(r)

    def _died(self, r) -> None:
        proc = self.procs[r]
        proc.join(timeout=1)
        self._failed(r, f"process died with exit code {proc.exitcode}")

    def _failed(self, r, text: str) -> None:
        self.failures[r] = (None, text)
        self.finished.add(r)
        self._abort_segment(f"rank {r} failed: {text.splitlines()[0]}")
        self._gone(r, "failed")
        if self.kill_at is None:
            self.kill_at = time.monotonic() + GRACE_SECONDS

    def _gone(self, r, how: str) -> None:
        """Rank ``r`` has ended (``how``: returned, failed): an exchange its peers are in,
        or will enter, can no longer complete, so they are told, with its name."""
        self.gone[r] = how
        self._check_exchange(time.monotonic())

    def _check_exchange(self, now) -> None:
        if not self.exchange:
            return
        gone = [r for r in self.gone if r not in self.exchange]
        if gone:
            self._release(f"not every rank arrived: rank {gone[0]} {self.gone[gone[0]]} and "
                          f"will not join the exchange (start(), barrier()) that ranks "
                          f"{sorted(self.exchange)} wait in")
        elif now - self.exchange_since > START_TIMEOUT:
            missing = [r for r in self.running() if r not in self.exchange]
            for r in missing:
                self.failures[r] = (None, f"did not call start() (or barrier()) within "
                                          f"{START_TIMEOUT:.0f} s of its peers")
            self._release(f"not every rank arrived within {START_TIMEOUT:.0f} s: ranks "
                          f"{missing} did not call start() (or barrier())")
            if self.kill_at is None:
                self.kill_at = now + GRACE_SECONDS

    def _release(self, why: str) -> None:
        for r in list(self.exchange):
            self.pipes[r].send(("abort", why))
        self.exchange.clear()
        self.exchange_since = None

    # -- ending ------------------------------------------------------------------------

    def _abort_segment(self, report: str) -> None:
        """Abort every rank through the shared control rows, leaving ``report`` for them."""
        cfg = self.cfg
        view = np.ndarray((cfg.ctl_bytes,), np.uint8, buffer=self.ctl_shm.buf)
        rows = view[: cfg.nranks * L.CTL_ROW.itemsize].view(L.CTL_ROW)
        report_area = view[cfg.nranks * L.CTL_ROW.itemsize:]
        if not report_area[0]:          # the first report stays; a closed rank left none
            raw = report.encode()[: report_area.size - 1]
            report_area[: len(raw)] = np.frombuffer(raw, np.uint8)
            report_area[len(raw)] = 0
        rows["abort"][:] = 1
        del rows, report_area, view

    def abort(self, report: str) -> None:
        self._abort_segment(report)
        self.kill_all()

    def kill_all(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()

    def unlink(self) -> None:
        if not self.unlinked:
            self.unlinked = True
            for shm in self.segments:
                shm.unlink()

    def end(self) -> None:
        """Whatever happened: no rank process outlives the launch, no segment stays."""
        for p in self.procs:
            p.join(timeout=GRACE_SECONDS if not self.failures else 1.0)
            if p.is_alive():
                p.kill()
                p.join()
        for shm in self.segments:
            shm.close()
        self.unlink()
