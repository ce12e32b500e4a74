"""The user-facing communicator: prepare, start, run -> Future, stats, close.

A thin composition of a rank's host parts, each with one job, none of which knows the
communicator:

- ``catalog.Catalog``: the registered collectives and their places in the daemon's table;
- ``late_registration.LateRegistrations``: collectives prepared after ``start()``, placed
  without an exchange and published in this rank's control row; their runs wait on the host
  until the poller has seen every peer publish the same signature;
- ``submission.Submissions``: the SQ writer, the runs in flight and those held on the host
  (at most ``RUNS_IN_FLIGHT`` of a collective are in flight, so the k-th run on every rank
  meets the k-th run on every other rank);
- ``completion.CompletionQueue``: futures completed from CQ entries, by the process's poller
  or by a thread blocked in ``Future.result()`` (the fastest way to learn of a completion),
  so done-callbacks run on whichever of the two completed the future;
- ``launcher.Launcher``: a host thread that (re)launches the daemon kernel whenever work is
  undone (the daemon quits by itself when idle or stuck);
- ``polled.PolledRank``: what the process's poller (``host.poller``, one thread for every
  communicator of the process) does for this rank: the CQ, the watchdog that turns a stall
  into a report and a clean abort, the heartbeat;
- ``rankstate.RankState``: the phase and the first error.

They share the communicator's one lock.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from .. import platform
from ..log import logger
from ..platform import backend
from ..protocol import layout as L
from ..protocol.codes import POINT_TO_POINT, normalize_dtype
from ..errors import AbortedError, PydfcclError
from ..sched.policies import get_policy
from .arrays import Array
from .arguments import require_int
from .buffers import BufferChecker
from .catalog import PRIORITY_LIMIT, Catalog, CollSpec
from .completion import CompletionQueue
from .daemons import daemon_for, launch_args
from .futures import CollectiveFuture
from .hostspin import warm_up
from . import liveness
from .late_registration import LateRegistrations
from .launcher import Launcher
from .polled import PolledRank
from .poller import poller
from .rankstate import Phase, RankState
from .registration import (SHARE, SHARE_MODES, LatePlacer, check_signatures, overflow_slots,
                           placement, shared_by_all)
from .shared_slots import SharedSlots, share_slots
from .split_rows import SplitRows, split_counts
from .status import rank_stats, world_status
from .stream_gate import process_gate
from .submission import Submissions
from .trace import TraceReader
from .watchdog import Watchdog
from .world import World

__all__ = ["Communicator", "CollSpec", "CollectiveFuture"]


class Communicator:
    """One rank's handle on a world. Made by :func:`pydfccl.launch`, not by users."""

    def __init__(self, world: World, rank: int, policy="dfccl", exchange=None,
                 watchdog_timeout: float | None = None, persistent: bool = True,
                 timeout: float | None = None):
        if not 0 <= rank < world.nranks:
            raise ValueError(f"rank {rank} out of range for {world.nranks} ranks")
        self.world = world
        self.rank = rank
        self.nranks = world.nranks
        self.policy = get_policy(policy)
        # persistent=False is the launch-per-collective baseline: no daemon loop, every run()
        # launches a kernel that runs what is queued and exits.
        self.persistent = persistent
        if not persistent:
            self.policy = get_policy("launch_per_call")
        self._exchange = exchange or (lambda obj: [obj])
        self._lock = threading.Lock()
        ctl = world.ctl
        self._catalog = Catalog(world.config, rank, self.nranks)
        self._specs, self._index = self._catalog.specs, self._catalog.index   # run() reads
        self._submissions = Submissions(ctl, rank, self._lock)
        self._state = RankState(world, rank, self._lock, self._submissions.fail_all)
        self._cq = CompletionQueue(ctl, rank, self._lock, self._submissions, self._state,
                                   self._catalog.by_index, self.policy.quits)
        self._check_buffer = BufferChecker()
        self._row = ctl[rank: rank + 1]
        # a one-word view of the field every run reads (a field lookup on the row makes a
        # new view each time, about a microsecond)
        self._abort_word = ctl["abort"][rank: rank + 1]
        stall_timeout = timeout      # the user's: a stall that may still end fails then
        timeout = (watchdog_timeout if watchdog_timeout is not None
                   else backend.watchdog_seconds)
        self._watchdog = Watchdog(world, rank, timeout, self._catalog.describe,
                                  abort_after=stall_timeout,
                                  proves_deadlock=not self.policy.preemptive,
                                  never_quits=not self.policy.quits)
        # A peer that has not prepared a late registration yet may only be late (a rank
        # saving a checkpoint before its first barrier): the stall is reported by the
        # watchdog, and the registration fails as unmatched at the user's timeout.
        self._late = LateRegistrations(world, rank, self._lock, self._catalog,
                                       self._submissions, self._state,
                                       self._watchdog.abort_after)
        self._launcher: Launcher | None = None      # from start() on
        self._tracer: TraceReader | None = None
        self._polled: PolledRank | None = None
        self._shared: SharedSlots | None = None   # more collectives than slots (slots.py)
        self._gate = None           # the process's stream gate, from the first stream= on
        self._split_rows = SplitRows(self.nranks)   # all_to_allv runs' counts

    @classmethod
    def from_mpi(cls, mpi_comm, *, policy="dfccl", watchdog_timeout: float | None = None,
                 persistent: bool = True, timeout: float | None = None,
                 **sizes) -> "Communicator":
        """This process's rank of a world of ``mpi_comm.size`` ranks, one per MPI process
        (``mpiexec``); ``sizes`` as for ``launch``. See :mod:`pydfccl.bootstrap.mpi`."""
        from ..bootstrap.mpi import communicator_from_group
        return communicator_from_group(mpi_comm, policy=policy,
                                       watchdog_timeout=watchdog_timeout,
                                       persistent=persistent, timeout=timeout, **sizes)

    @classmethod
    def from_env(cls, *, policy="dfccl", watchdog_timeout: float | None = None,
                 persistent: bool = True, timeout: float | None = None,
                 **sizes) -> "Communicator":
        """This process's rank when a torchrun-style launcher set RANK, WORLD_SIZE,
        MASTER_ADDR and MASTER_PORT (rank 0 serves a loopback store there)."""
        from ..bootstrap.mpi import communicator_from_group
        from ..bootstrap.store import env_group
        return communicator_from_group(env_group(), policy=policy,
                                       watchdog_timeout=watchdog_timeout,
                                       persistent=persistent, timeout=timeout, **sizes)

    # -- registration ----------------------------------------------------------------------

    def prepare(self, coll_id: int, kind: str, count: int, dtype="float32", op: str = "sum",
                root: int = 0, priority: int = 0, peer: int | None = None) -> None:
        """Register collective ``coll_id`` (same arguments on every rank, except priority).

        Point to point: ``kind="send"`` with ``peer=`` the receiving rank on the sender, and
        ``kind="recv"`` with ``peer=`` the sender on the receiver, under the same id, count
        and dtype; no other rank registers that id.

        After ``start()`` (late registration) every rank must prepare its collectives in the
        same order, and each (sender, receiver) pair its transfers in the same order; the
        first run waits until every peer has published the same signature, and a
        difference fails the runs with ``ValueError`` naming the field and the ranks."""
        started = self._state.started
        if not started:
            self._state.require(Phase.PREPARING, "prepare")
        spec = self._catalog.new_spec(coll_id, kind, count, dtype, op, root, priority, peer)
        if started and self._shared is not None and not self._has_own_room(spec):
            self._shared.prepare_late(spec, self._catalog.signature(spec))   # (slots.py)
            poller.wake()
        elif started:
            self._late.add(spec)
        self._specs[spec.coll_id] = spec

    def start(self, share_slots: bool | str = False) -> None:
        """End registration: check signatures across ranks, then start the daemon.
        Collectives share the daemon's slots (host/slots.py) when they need more than it
        has, or with ``share_slots=True`` (the same on every rank): then any number may be
        prepared after ``start()`` too. ``"overflow"``: slots of their own while they fit;
        beyond, those prepared after ``start()`` share the last ``overflow_slots``."""
        self._state.require(Phase.PREPARING, "start")
        if share_slots not in SHARE_MODES:
            raise ValueError(f"share_slots must be one of {SHARE_MODES}, not {share_slots!r}")
        mine = self._catalog.signatures()
        if share_slots:
            mine[SHARE] = share_slots
        per_rank = self._exchange(mine)
        if any(SHARE in sigs for sigs in per_rank):
            per_rank, share_slots = shared_by_all(per_rank)
        check_signatures(per_rank)
        cfg = self.world.config
        index, conn, used = placement(per_rank, self.nranks)
        pool = self.world.pools[self.rank]
        own = cfg.max_colls                         # slots of collectives of their own
        if used > cfg.max_colls or share_slots is True:   # every collective shares them
            self._share_slots(per_rank)
        else:
            pool.write(L.P_COLLS, self._catalog.place_all(index, conn))
            spare = overflow_slots(self.nranks, cfg.max_colls)
            if share_slots == "overflow" and used + spare <= cfg.max_colls:
                own = cfg.max_colls - spare
                self._share_slots([], first=own)
        pool.write(L.P_PARAMS, backend.policy_params(self.policy))
        self._late.begin(LatePlacer(self.nranks, own, len(index), used))
        self._tracer = TraceReader(pool, self.rank, cfg.nblocks, self._catalog.by_index)
        self._stream = platform.new_stream()
        self._daemon = daemon_for(self.policy, cfg.nthreads)
        if backend.waiter_spin_seconds > 0:    # waiters spin in compiled loops: load them now
            warm_up()
        self._state.phase = Phase.STARTED
        logger.info("rank %d/%d started: %d collectives, policy %s, %s", self.rank, self.nranks,
                    len(self._specs), self.policy.name,
                    "persistent daemon" if self.persistent else "a launch per collective")
        self._launch_args = launch_args(self.world, self.rank)
        configured = platform.configure_launch(self._daemon, cfg.nblocks, cfg.nthreads,
                                               self._stream)
        self._launcher = launcher = Launcher(
            self.rank, self._lock, self._cq.undone, self.world.activity, self._wants_daemon,
            self._stream, (configured, self._launch_args), self.policy.quits,
            self._state.fail_everywhere)
        self._submissions.wake = launcher.notify
        if not self.persistent:
            self._cq.on_idle = launcher.all_done
            self._cq.on_resubmitted = self._late.on_submitted = self._launch_once
        if self._shared is not None and not self.persistent:
            self._shared.on_submitted = self._launch_once
        self._polled = PolledRank(self.rank, self._row, self._state, self._cq,
                                  self._submissions, self._late, self._watchdog, launcher,
                                  self._tracer, self.persistent, self._shared)
        liveness.register(self._row)        # peers now see this process end at once
        poller.add(self._polled)
        self._polled.beat(time.monotonic_ns(), force=True)   # peers now watch the heartbeat
        if self.persistent:
            launcher.start()

    def _share_slots(self, per_rank: list, first: int = 0) -> None:
        self._shared = share_slots(self.world, self.rank, self._lock, self._catalog,
                                   self._submissions, per_rank, self._state.fail_everywhere,
                                   first)
        self._cq.on_done_slot = self._shared.completed

    def _has_own_room(self, spec) -> bool:
        """A collective prepared after ``start(share_slots="overflow")`` takes a slot of
        its own while one is left, decided alike on every rank (they prepare collectives
        in one order); a transfer, seen by two ranks only, always shares."""
        return (self._shared.first > 0 and spec.kind not in POINT_TO_POINT
                and self._late.fits(spec.kind))

    # -- running ---------------------------------------------------------------------------

    def barrier(self) -> None:
        """Return once every rank has called ``barrier()``: a meeting of the hosts through
        the bootstrap (no collective runs, and nothing on the GPU waits)."""
        self._state.require(Phase.STARTED, "barrier")
        self._state.raise_if_failed()
        self._exchange(None)

    def empty(self, count: int, dtype="float32") -> Array:
        """An uninitialized ``pydfccl.Array`` of ``count`` elements on this rank's device
        (host memory under the simulator), with numpy's idioms on both: ``x[...] = v``,
        ``x[a:b] = values``, ``np.asarray(x)``."""
        count = require_int("count", count, minimum=0)
        return Array.empty(count, normalize_dtype(dtype))

    def run(self, coll_id: int, send, recv=None, priority: int | None = None, *,
            stream=None, send_counts=None, recv_counts=None) -> Future:
        """Submit one run of a prepared collective; ``recv`` defaults to ``send`` (in place).
        An all_to_allv's run gives its ``send_counts`` and ``recv_counts`` (docs/api.md).

        Returns a Future whose result is ``recv`` (the object passed); errors (deadlock,
        abort) raise there. The future holds both buffers until the run completes. A
        collective of ``count=0`` completes at once.

        ``stream`` (a Numba, CuPy or PyTorch stream, anything with ``__cuda_stream__``, or
        a raw handle): the run starts once the work queued on that stream before the call
        has finished, and the call returns at once; without it the inputs must be complete
        already. Either way the result is waited for on the host (``result()``): no stream
        ever waits for a collective (docs/design.md, "Streams").
        """
        state = self._state
        if not state.started:
            state.require(Phase.STARTED, "run")
        spec = self._specs.get(coll_id) if type(coll_id) is int else None
        if spec is None:
            spec = self._spec_of(coll_id)
        if recv is None and not spec.in_place_ok:
            raise ValueError(f"collective {spec.coll_id} ({spec.kind}) needs a recv buffer")
        recv = send if recv is None else recv
        counts = (split_counts(spec, self.nranks, self.rank, send_counts, recv_counts)
                  if spec.per_peer_counts or (send_counts, recv_counts) != (None, None) else None)
        elems = spec.sizes(self.nranks) if counts is None else map(sum, counts)
        send_addr, recv_addr = self._check_buffer.addresses(spec, self.rank, send, recv, *elems)
        prio = spec.priority if priority is None else require_int(
            "priority", priority, minimum=-PRIORITY_LIMIT, maximum=PRIORITY_LIMIT,
            where=f"collective {spec.coll_id}: ")
        handle = None if stream is None else platform.stream_handle(stream)
        buffers = (send, recv)
        future = CollectiveFuture(self._cq, running=True, buffers=buffers,
                                  coll_id=spec.coll_id)
        if counts is not None:       # the daemon reads the run's row in place of send
            send_addr = self._split_rows.take(send_addr, counts, future)
        index = self._index.get(spec.coll_id)     # None: it shares slots (slots.py)
        gate = self._gate
        if handle is not None and gate is None:
            gate = self._gate = process_gate()      # None: the simulator's streams are done
        key = gate and (self, index if index is not None else -1 - spec.coll_id)
        if gate is not None and (handle is not None or gate.waiting(key)):
            # behind the stream's work, and behind earlier runs of this collective waiting
            # for theirs: the k-th run of a collective meets the k-th on every rank
            state.raise_if_failed()
            gate.gate(handle, lambda: self._submit(spec, index, future, send_addr, recv_addr,
                                                   prio, buffers),
                      future.set_exception, key=key)
            return future
        self._submit(spec, index, future, send_addr, recv_addr, prio, buffers)
        return future

    def _submit(self, spec, index, future, send_addr, recv_addr, prio, buffers) -> None:
        """Into the SQ (or behind the runs of ``index`` held on the host); raises the
        communicator's error if it has failed."""
        state = self._state
        with self._lock:
            if state.error is None and self._abort_word[0]:
                state.error = state.abort_error()
            if state.error is not None:
                raise state.error
            if not spec.count:         # nothing to move: done, as NCCL does
                future.set_result(buffers[1])
                return
            if index is None:          # waits for a grant of a slot (slots.py)
                self._shared.add(spec.coll_id, (future, send_addr, recv_addr, prio, buffers))
                poller.wake()
                return
            self._submissions.add(index, future, send_addr, recv_addr, prio, buffers)
            self._launcher.notify()
        poller.wake()
        if not self.persistent:
            self._launch_once()

    def _spec_of(self, coll_id):
        """The spec of ``coll_id``, or the error that names what is wrong with it."""
        coll_id = require_int("coll_id", coll_id, minimum=0)
        if coll_id not in self._specs:
            raise ValueError(f"unknown collective {coll_id!r}; prepared: {sorted(self._specs)}")
        return self._specs[coll_id]

    def _launch_once(self) -> None:
        """The launch-per-collective baseline: a kernel for the runs submitted so far."""
        with self._lock:
            limit = self._submissions.submitted
        self._launcher.launch_once(limit)

    def synchronize_device(self) -> None:
        """A device-wide synchronize, the call that deadlocks NCCL-style libraries.

        On a GPU this is ``cudaDeviceSynchronize``; it returns only when every daemon on the
        device has quit. The simulator has no device, so it waits until this rank's daemon
        launch in progress (if any) has ended, which is the same condition for this rank.
        """
        state = self._state
        state.require(Phase.STARTED, "synchronize_device")
        state.raise_if_failed()
        stop = lambda: (state.error is not None or not state.started  # noqa: E731
                        or bool(self._row["abort"][0]))
        self._row["host_blocked"] = 1
        try:
            with self._lock:   # as with NCCL, the sync comes after the submitted work's launch
                generation = self._launcher.wait_on_stream(stop)
            if backend.launch_runs_kernel:    # the launch ending is the kernel ending
                with self._lock:
                    self._launcher.wait_for_launch_end(generation, stop)
            else:
                platform.synchronize_device()
        finally:
            self._row["host_blocked"] = 0
        if self._row["abort"][0] and state.started:
            raise state.abort_error()   # the sync returned only because the watchdog aborted

    # -- what is going on ------------------------------------------------------------------

    def status(self) -> list[dict]:
        """Live status of every rank (all control rows are visible to every rank): its
        outstanding count, whether its host is blocked in a sync, its preemptions, and per
        daemon block the collective it is on (by coll_id), its loop and step, and whom it
        waits for (published once a wait lasts 20 us, and at each preemption). This rank's
        entry also lists its collectives ``in_flight``, the runs ``queued`` behind them, and
        its host's view of the ``daemon`` launches (for reports of a stuck job)."""
        return world_status(self.world, self.rank, self._catalog.by_index, self._submissions,
                            self._launcher, self._lock)

    def trace(self) -> list[dict]:
        """The events of this rank's daemon blocks so far (the latest PYDFCCL_TRACE_KEEP,
        200,000 by default), oldest first per block: dicts with ``t_ns``, ``rank``,
        ``block``, ``event`` (absorbed, loaded, preempted, completed, launched, quit),
        ``coll`` (coll_id or None), ``loop``, ``step``. A thread of pydfccl's drains the
        logs while work goes on; ``trace_lost()`` counts the events missing from it."""
        self._require_started_once("trace")
        return self._tracer.events()

    def trace_lost(self) -> int:
        """Events not in ``trace()``: overwritten on the device before they were read, or
        let go on the host to keep the latest PYDFCCL_TRACE_KEEP."""
        self._require_started_once("trace_lost")
        return self._tracer.missing

    def stats(self) -> dict:
        return rank_stats(self.world, self.rank, self._submissions, self._cq, self._launcher,
                          self.policy.name, self._shared)

    # -- shutting down -----------------------------------------------------------------------

    def close(self, cause: BaseException | None = None) -> None:
        """Stop the daemon, fail what is still outstanding, join the host threads. Runs
        still outstanding abort every rank (their peers would wait for this rank's daemon),
        with ``cause`` (what ended the rank; ``with`` passes the exception) as the reason."""
        state = self._state
        if state.phase is Phase.CLOSED:
            return
        started = state.started
        with self._lock:    # runs waiting for a grant too: their peers may have theirs
            left = self._cq.undone() + self._submissions.waiting_count() if started else 0
        state.phase = Phase.CLOSED
        if started:    # a drain in progress ends before the caller can free the pool
            self._tracer.close()
        if left and state.error is None:   # its peers would wait for its daemon for ever
            why = (f"rank {self.rank} failed: {type(cause).__name__}: {cause} (" if cause
                   else f"rank {self.rank} closed its communicator (")
            self.world.abort_with(why + f"{left} of its runs outstanding)")
        self._row["heartbeat"] = -1      # gone on purpose: not a failure for the peers
        self._row["abort"] = 1
        if started:
            poller.remove(self._polled)
            self._launcher.stop()
            if not self._launcher.thread_alive:
                platform.destroy_stream(self._stream)
        self._submissions.fail_all(AbortedError(f"rank {self.rank}: communicator closed"))
        if self.world.net is not None:   # the daemon stopped: its last writes go out now
            self.world.net.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(cause=exc)

    # -- helpers -----------------------------------------------------------------------------

    def _wants_daemon(self) -> bool:
        """Whether this rank still runs collectives (the launcher's to ask)."""
        return self._state.started and not self._abort_word[0]

    def _require_started_once(self, what: str) -> None:
        if self._tracer is None:
            raise PydfcclError(f"{what}() is only allowed after start()")

    def __repr__(self):
        return (f"<pydfccl.Communicator rank {self.rank}/{self.nranks} "
                f"{self._state.phase.value} policy={self.policy.name}>")
