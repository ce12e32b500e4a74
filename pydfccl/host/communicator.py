"""The user-facing communicator: prepare, start, run -> Future, stats, close.

Per rank it keeps one host thread, a *launcher* that (re)launches the daemon kernel
whenever work is outstanding (the daemon quits by itself when idle or stuck). The process's
*poller* (:mod:`pydfccl.host.poller`, one thread for every communicator of the process) turns
CQ entries into completed futures and runs each communicator's *watchdog*, which turns a
stall into a report and a clean abort. A thread blocked in ``Future.result()`` drains its
CQ too (it is the fastest way to learn of a completion), so done-callbacks run on whichever
of the two completed the future.

At most one run of a collective is in flight; further runs of it wait on the host, so the
k-th run on every rank meets the k-th run on every other rank.

A collective prepared after ``start()`` (late registration, :mod:`pydfccl.host.registration`) is
placed without an exchange and published in this rank's control row; its runs wait on the
host until the poller has seen every peer publish the same signature.
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_for_futures
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np

from ..protocol import layout as L
from .. import platform
from .buffers import BufferChecker, dropped_by_user
from ..protocol.codes import (OUT_OF_PLACE_ONLY, POINT_TO_POINT, dtype_code, kind_code,
                    normalize_dtype, op_code)
from .launcher import Launcher, LauncherError
from .hostspin import SPINS_PER_CALL, wait_for_stamp, warm_up
from ..kernels.plans import ONE_SHOT, table_kind
from ..kernels.ring import channel_count
from .poller import poller
from ..errors import AbortedError, DeadlockError, PydfcclError
from .futures import CollectiveFuture
from ..log import logger
from ..protocol.reference import buffer_elems
from .registration import LatePlacer, check_signatures, late_verdict, placement
from .trace import TraceReader
from ..sched.policies import get_policy
from .watchdog import Watchdog, rank_status
from .world import World

__all__ = ["Communicator", "CollSpec"]


@dataclass(frozen=True)
class CollSpec:
    """What ``prepare`` registered; compared field by field across ranks at ``start``."""

    coll_id: int
    kind: str
    count: int
    dtype: str
    op: str
    root: int
    priority: int

    def sizes(self, nranks: int) -> tuple[int, int]:
        """Elements the send and recv buffers need (NCCL's conventions for ``count``)."""
        return buffer_elems(self.kind, self.count, nranks)

    @property
    def in_place_ok(self) -> bool:
        return self.kind not in OUT_OF_PLACE_ONLY

    def signature(self) -> dict:
        """The fields that must agree across ranks (priority is a per-rank preference)."""
        return dict(kind=self.kind, count=self.count, dtype=self.dtype, op=self.op,
                    root=self.root)


_daemons = {}
_daemons_lock = threading.Lock()


def _daemon_for(policy, nthreads: int):
    """The compiled daemon of ``policy`` for blocks of ``nthreads`` (one per policy and
    register cap in a process)."""
    from ..kernels.compiler import register_cap
    from ..kernels.daemon import compile_now, make_daemon

    key = (policy.name, policy.functions, register_cap(nthreads))
    with _daemons_lock:
        if key not in _daemons:
            kernel = make_daemon(policy, nthreads)
            compile_now(kernel)
            _daemons[key] = kernel
        return _daemons[key]


class Communicator:
    """One rank's handle on a world. Made by :func:`pydfccl.launch`, not by users."""

    def __init__(self, world: World, rank: int, policy="dfccl", exchange=None,
                 watchdog_timeout: float | None = None, persistent: bool = True):
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
        self._specs: dict[int, CollSpec] = {}
        self._index: dict[int, int] = {}
        self._by_index: dict[int, int] = {}
        self._placer: LatePlacer | None = None
        self._unconfirmed: dict[int, float] = {}   # late index -> when it was registered
        self._state = "preparing"
        self._lock = threading.Lock()
        self._launcher: Launcher | None = None      # from start() on
        # by collective index: its runs in the SQ, not yet completed, oldest first (at most
        # RUNS_IN_FLIGHT), and the runs held on the host behind them
        self._inflight = collections.defaultdict(collections.deque)
        self._pending = collections.defaultdict(collections.deque)
        self._submitted = 0
        self._completed = 0
        self._dropped_buffers = 0
        self._cq_head = 0
        self._error: Exception | None = None
        self._drain_lock = threading.Lock()
        self._helpers = 0          # threads waiting in Future.result() right now
        self._helped_at = 0.0      # when the last of them stopped (perf_counter)
        self._beat_at = 0
        ctl = world.ctl
        self._sq = {name: ctl["sq"][name][rank] for name in L.SQ_ENTRY.names}
        self._cq_stamp = ctl["cq"]["stamp"][rank]
        self._cq_coll = ctl["cq"]["coll"][rank]
        self._cq_stamp_addr = self._cq_stamp.ctypes.data
        self._cq_stamp_stride = self._cq_stamp.strides[0]
        self._check_buffer = BufferChecker()
        self._blocks = ctl["blocks"][rank]
        self._row = ctl[rank: rank + 1]
        # One-word views of the fields that every run touches (a field lookup on the row
        # makes a new view each time, about a microsecond).
        self._abort_word = ctl["abort"][rank: rank + 1]
        self._submitted_word = ctl["host_submitted"][rank: rank + 1]
        self._completed_word = ctl["host_completed"][rank: rank + 1]
        timeout = watchdog_timeout if watchdog_timeout is not None else (
            60.0 if platform.SIMULATOR else 20.0)
        self._watchdog = Watchdog(world, rank, timeout, self._describe_coll)
        # A late registration that a peer has not matched by then is reported as such, before
        # the watchdog would call the stall a deadlock.
        self._late_timeout = timeout / 2

    @classmethod
    def from_mpi(cls, mpi_comm, *, policy="dfccl", watchdog_timeout: float | None = None,
                 persistent: bool = True, **sizes) -> "Communicator":
        """This process's rank of a world of ``mpi_comm.size`` ranks, one per MPI process
        (``mpiexec``); ``sizes`` as for ``launch``. See :mod:`pydfccl.bootstrap.mpi`."""
        from ..bootstrap.mpi import communicator_from_group
        return communicator_from_group(mpi_comm, policy=policy,
                                       watchdog_timeout=watchdog_timeout,
                                       persistent=persistent, **sizes)

    @classmethod
    def from_env(cls, *, policy="dfccl", watchdog_timeout: float | None = None,
                 persistent: bool = True, **sizes) -> "Communicator":
        """This process's rank when a torchrun-style launcher set RANK, WORLD_SIZE,
        MASTER_ADDR and MASTER_PORT (rank 0 serves a loopback store there)."""
        from ..bootstrap.mpi import communicator_from_group
        from ..bootstrap.store import env_group
        return communicator_from_group(env_group(), policy=policy,
                                       watchdog_timeout=watchdog_timeout,
                                       persistent=persistent, **sizes)

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
        if self._state != "started":
            self._require("preparing", "prepare")
        if not isinstance(coll_id, (int, np.integer)) or coll_id < 0:
            raise ValueError(f"coll_id must be a non-negative int, got {coll_id!r}")
        if coll_id in self._specs:
            raise ValueError(f"collective {coll_id} is already prepared")
        if len(self._specs) >= self.world.config.max_colls:
            raise ValueError(f"at most {self.world.config.max_colls} collectives per "
                             "communicator (WorldConfig.max_colls)")
        kind_code(kind)
        op_code(op)
        dt = normalize_dtype(dtype)
        if not isinstance(count, (int, np.integer)) or count < 1:
            raise ValueError(f"collective {coll_id}: count must be a positive int, got {count!r}")
        if not 0 <= root < self.nranks:
            raise ValueError(f"collective {coll_id}: root {root} out of range 0..{self.nranks - 1}")
        if kind in POINT_TO_POINT:
            if peer is None or not 0 <= peer < self.nranks or peer == self.rank:
                raise ValueError(f"collective {coll_id}: a {kind} needs peer= another rank "
                                 f"(0..{self.nranks - 1}, not {self.rank}), got {peer!r}")
            root = peer     # the daemon finds a transfer's peer where a chain keeps its root
        elif peer is not None:
            raise ValueError(f"collective {coll_id}: peer= is for send and recv, not {kind}")
        spec = CollSpec(int(coll_id), kind, int(count), dt.name, op, int(root), int(priority))
        if self._state == "started":
            self._prepare_late(spec)
        self._specs[spec.coll_id] = spec

    def _daemon_kind(self, spec: CollSpec) -> int:
        """The kind the daemon's table records (``plans.ONE_SHOT`` for a small all_reduce)."""
        return table_kind(spec.kind, spec.count, np.dtype(spec.dtype).itemsize, self.nranks,
                          self.world.config.slot_bytes)

    def _signature(self, spec: CollSpec) -> dict:
        """What must agree across ranks: the spec's fields, and whether it runs one-shot,
        which a rank's PYDFCCL_ONE_SHOT_BYTES also decides (ranks that disagree would wait
        on different counters)."""
        return dict(spec.signature(), one_shot=self._daemon_kind(spec) == ONE_SHOT)

    def _table_entry(self, spec: CollSpec, conn: int) -> tuple:
        """The daemon's collective-table record of ``spec`` using connector sets from
        ``conn`` on."""
        cfg = self.world.config
        itemsize = np.dtype(spec.dtype).itemsize
        nchannels = channel_count(spec.kind == "all_reduce", spec.count, itemsize, self.nranks,
                                  cfg.nblocks, cfg.slot_bytes)
        return (self._daemon_kind(spec), dtype_code(spec.dtype), op_code(spec.op), spec.count,
                spec.root, nchannels, itemsize, conn)

    def _prepare_late(self, spec: CollSpec) -> None:
        """Place ``spec``, write its table entry (the daemon reads it at the first run,
        after an acquire of that run's SQ entry) and publish it for the peers."""
        if spec.kind in POINT_TO_POINT:
            sender, receiver = ((self.rank, spec.root) if spec.kind == "send"
                                else (spec.root, self.rank))
            index, conn = self._placer.transfer(sender, receiver)
        else:
            index, conn = self._placer.collective(spec.kind)
        entry = np.array([self._table_entry(spec, conn)], L.COLL_ENTRY)
        self.world.pools[self.rank].write(L.P_COLLS + index * L.COLL_ENTRY.itemsize, entry)
        published = self._row["registered"][0]
        one_shot = int(entry["kind"][0] == ONE_SHOT)
        published[index] = (0, spec.coll_id, kind_code(spec.kind), dtype_code(spec.dtype),
                            op_code(spec.op), spec.count, spec.root, one_shot)
        published["published"][index] = 1       # last: the peers read the fields after it
        with self._lock:
            self._index[spec.coll_id] = index
            self._by_index[index] = spec.coll_id
            self._unconfirmed[index] = time.monotonic()
        poller.wake()

    def start(self) -> None:
        """End registration: check signatures across ranks, then start the daemon."""
        self._require("preparing", "start")
        mine = {cid: self._signature(spec) for cid, spec in self._specs.items()}
        per_rank = self._exchange(mine)
        check_signatures(per_rank)
        cfg = self.world.config
        index, conn, used = placement(per_rank, self.nranks)
        if used > cfg.max_colls:
            raise ValueError(f"the collectives need {used} connector sets (an all_to_all needs "
                             f"nranks - 1), more than WorldConfig.max_colls = {cfg.max_colls}")
        table = np.zeros(L.MAX_COLLS, L.COLL_ENTRY)
        for coll_id, spec in self._specs.items():
            self._index[coll_id] = index[coll_id]
            table[index[coll_id]] = self._table_entry(spec, conn[coll_id])
        pool = self.world.pools[self.rank]
        pool.write(L.P_COLLS, table)
        pool.write(L.P_PARAMS, self.policy.param_array(platform.SIMULATOR))
        self._placer = LatePlacer(self.nranks, cfg.max_colls, len(index), used)
        self._by_index = {i: c for c, i in index.items()}   # every rank's ids, for reports
        self._tracer = TraceReader(self.world.pools[self.rank], self.rank, cfg.nblocks,
                                   self._by_index)
        self._stream = platform.new_stream()
        self._daemon = _daemon_for(self.policy, cfg.nthreads)
        if platform.WAIT_SPIN_SECONDS > 0:    # waiters spin in compiled loops: load them now
            warm_up()
        self._state = "started"
        logger.info("rank %d/%d started: %d collectives, policy %s, %s", self.rank, self.nranks,
                    len(self._specs), self.policy.name,
                    "persistent daemon" if self.persistent else "a launch per collective")
        self._launch_args = (
            np.int64(self.world.ctl_addr[self.rank]), np.int64(self.world.pool_addr[self.rank]),
            np.int64(self.world.peers.addr), np.int64(self.rank), np.int64(self.nranks),
            np.int64(cfg.nslots), np.int64(cfg.slot_bytes), np.int64(cfg.conn_stride),
            np.int64(L.NO_LIMIT))
        configured = platform.configure_launch(self._daemon, cfg.nblocks, cfg.nthreads,
                                               self._stream)
        self._launcher = Launcher(self.rank, self._lock, self._undone, self._world_activity,
                                  self._wants_daemon, self._stream,
                                  (configured, self._launch_args), self.policy.quits,
                                  self._fail_everywhere)
        poller.add(self)
        self._beat(time.monotonic_ns(), force=True)   # peers now watch this rank's heartbeat
        if self.persistent:
            self._launcher.start()

    # -- running ---------------------------------------------------------------------------

    def barrier(self) -> None:
        """Return once every rank has called ``barrier()``: a meeting of the hosts through
        the bootstrap (no collective runs, and nothing on the GPU waits)."""
        self._require("started", "barrier")
        self._exchange(None)

    def empty(self, count: int, dtype="float32"):
        """An uninitialized array on this rank's device (numpy under the simulator)."""
        return platform.empty(count, normalize_dtype(dtype))

    def run(self, coll_id: int, send, recv=None, priority: int | None = None) -> Future:
        """Submit one run of a prepared collective; ``recv`` defaults to ``send`` (in place).

        Returns a Future whose result is ``recv``; errors (deadlock, abort) raise there.
        """
        self._require("started", "run")
        if coll_id not in self._specs:
            raise ValueError(f"unknown collective {coll_id!r}; prepared: {sorted(self._specs)}")
        spec = self._specs[coll_id]
        if recv is None and not spec.in_place_ok:
            raise ValueError(f"collective {coll_id} ({spec.kind}) needs a recv buffer")
        recv = send if recv is None else recv
        send_elems, recv_elems = spec.sizes(self.nranks)
        send_addr = self._check_buffer(send, spec, "send", send_elems)
        recv_addr = self._check_buffer(recv, spec, "recv", recv_elems)
        prio = spec.priority if priority is None else int(priority)
        future = CollectiveFuture(self, running=True)
        index = self._index[coll_id]
        with self._lock:
            if self._error is None and self._abort_word[0]:
                self._error = self._abort_error()
            if self._error is not None:
                raise self._error
            waiting = self._pending[index]
            if (waiting or index in self._unconfirmed
                    or len(self._inflight[index]) >= L.RUNS_IN_FLIGHT):
                waiting.append((future, send_addr, recv_addr, prio, (send, recv)))
            else:
                self._submit(index, future, send_addr, recv_addr, prio, (send, recv))
            self._launcher.notify()
        poller.wake()
        if not self.persistent:
            self._launch_once()
        return future

    def _launch_once(self) -> None:
        """The launch-per-collective baseline: a kernel for the runs submitted so far."""
        with self._lock:
            limit = self._submitted
        self._launcher.launch_once(limit)

    def _submit(self, index, future, send_addr, recv_addr, prio, buffers) -> None:
        """Write one SQ entry (caller holds the lock); the seq word goes last. ``buffers``
        (send, recv) stay referenced until completion: the daemon only has their addresses."""
        k = self._submitted
        slot = k % L.SQ_CAP
        self._sq["coll"][slot] = index
        self._sq["send"][slot] = send_addr
        self._sq["recv"][slot] = recv_addr
        self._sq["priority"][slot] = prio
        self._sq["seq"][slot] = k + 1
        self._submitted = k + 1
        self._submitted_word[0] = k + 1
        self._inflight[index].append((future, buffers))

    def _submit_waiting(self, index) -> int:
        """Submit the runs of ``index`` held on the host, as many as RUNS_IN_FLIGHT allows
        (caller holds the lock); how many."""
        waiting, count = self._pending[index], 0
        while waiting and len(self._inflight[index]) < L.RUNS_IN_FLIGHT:
            self._submit(index, *waiting.popleft())
            count += 1
        if count and self._launcher is not None:
            self._launcher.notify()
        return count

    def synchronize_device(self) -> None:
        """A device-wide synchronize, the call that deadlocks NCCL-style libraries.

        On a GPU this is ``cudaDeviceSynchronize``; it returns only when every daemon on the
        device has quit. The simulator has no device, so it waits until this rank's daemon
        launch in progress (if any) has ended, which is the same condition for this rank.
        """
        self._require("started", "synchronize_device")
        stop = lambda: (self._error is not None or self._state != "started"  # noqa: E731
                        or bool(self._row["abort"][0]))
        self._row["host_blocked"] = 1
        try:
            with self._lock:   # as with NCCL, the sync comes after the submitted work's launch
                generation = self._launcher.wait_on_stream(stop)
            if not platform.SIMULATOR:
                platform.synchronize_device()
            else:
                with self._lock:
                    self._launcher.wait_for_launch_end(generation, stop)
        finally:
            self._row["host_blocked"] = 0
        if self._row["abort"][0] and self._state == "started":
            raise self._abort_error()   # the sync returned only because the watchdog aborted

    def status(self) -> list[dict]:
        """Live status of every rank (all control rows are visible to every rank): its
        outstanding count, whether its host is blocked in a sync, its preemptions, and per
        daemon block the collective it is on (by coll_id), its loop and step, and whom it
        waits for (published once a wait lasts 20 us, and at each preemption). This rank's
        entry also lists its collectives ``in_flight``, the runs ``queued`` behind them, and
        its host's view of the ``daemon`` launches (for reports of a stuck job)."""
        out = []
        for r in range(self.nranks):
            st = rank_status(self.world, r)
            for blk in st["blocks"]:
                if blk["coll"] is not None:
                    blk["coll"] = self._by_index.get(blk["coll"], blk["coll"])
            out.append(st)
        with self._lock:    # this rank's host also knows which collectives it waits for
            out[self.rank]["in_flight"] = sorted(self._by_index[i]
                                                 for i, runs in self._inflight.items() if runs)
            out[self.rank]["queued"] = {self._by_index[i]: len(q)
                                        for i, q in self._pending.items() if q}
            out[self.rank]["daemon"] = self._launcher.view()
            out[self.rank]["launch_log"] = self._launcher.log()
        return out

    def trace(self) -> list[dict]:
        """The events of this rank's daemon blocks so far (the latest PYDFCCL_TRACE_KEEP,
        200,000 by default), oldest first per block: dicts with ``t_ns``, ``rank``,
        ``block``, ``event`` (absorbed, loaded, preempted, completed, launched, quit),
        ``coll`` (coll_id or None), ``loop``, ``step``. A thread of pydfccl's drains the
        logs while work goes on; ``trace_lost()`` counts the events missing from it."""
        self._require_started_once("trace")
        return self._tracer.events()

    def _drain_trace(self) -> None:
        """Copy new event-log records in (``progress.Poller._drain_traces``)."""
        if self._state != "started":   # closing: its pool may be going away
            return
        try:
            self._tracer.drain()
        except Exception as exc:     # a failed copy loses events, never a collective
            if self._state == "started":
                logger.warning("rank %d: reading the daemon's event log failed: %r",
                               self.rank, exc)

    def trace_lost(self) -> int:
        """Events not in ``trace()``: overwritten on the device before they were read, or
        let go on the host to keep the latest PYDFCCL_TRACE_KEEP."""
        return self._tracer.lost + self._tracer.dropped

    def stats(self) -> dict:
        blocks = self._blocks[: self.world.config.nblocks]
        launches = self._launcher.launches if self._launcher is not None else 0
        return dict(
            rank=self.rank,
            submitted=self._submitted,
            completed=self._completed,
            preemptions=int(blocks["preemptions"].sum()),
            launches=launches,
            relaunches=max(0, launches - 1),
            quits=int(blocks["exits"].min()) if len(blocks) else 0,
            steps=int(blocks["progress"].sum()),
            dropped_buffers=self._dropped_buffers,
            policy=self.policy.name,
        )

    # -- shutting down -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the daemon, fail what is still outstanding, join the host threads."""
        if self._state == "closed":
            return
        started = self._state == "started"
        self._state = "closed"
        if started:    # a drain in progress ends before the caller can free the pool
            self._tracer.close()
        self._row["heartbeat"] = -1      # gone on purpose: not a failure for the peers
        self._row["abort"] = 1
        if started:
            poller.remove(self)
            self._launcher.stop()
            if not self._launcher.thread_alive:
                platform.destroy_stream(self._stream)
        self._fail_all(AbortedError(f"rank {self.rank}: communicator closed"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- host threads ------------------------------------------------------------------------

    def _outstanding(self) -> int:
        return self._submitted - self._completed

    def _undone(self) -> int:
        """Outstanding runs whose CQ stamp is not posted yet: what a daemon is still needed
        for (caller holds the lock). A run the daemon finished waits for no daemon while the
        host has yet to drain it (a busy thread, a poller waiting for the GIL); counted as
        outstanding, they kept idle ranks' daemons relaunching every 10 to 17 ms on an
        H200. The CQ head and ``_completed`` move together under the lock, so the count is
        exact: the launcher's rule (``host.launcher``) relies on it."""
        undone, head = self._outstanding(), self._cq_head
        for _ in range(min(undone, L.CQ_CAP)):
            if self._cq_stamp[head % L.CQ_CAP] != head + 1:
                break
            undone, head = undone - 1, head + 1
        return undone

    def _world_activity(self) -> int:
        """Changes whenever any rank submits or makes progress: a reason to relaunch."""
        ctl = self.world.ctl
        return int(ctl["host_submitted"].sum()) + int(ctl["blocks"]["progress"].sum())

    def _wants_daemon(self) -> bool:
        """Whether this rank still runs collectives (the launcher's to ask)."""
        return self._state == "started" and not self._row["abort"][0]

    def _abort_error(self) -> Exception:
        report = self.world.get_report() or f"rank {self.rank}: aborted"
        return DeadlockError(report) if report.startswith("deadlock") else AbortedError(report)

    # -- what the process's poller calls (pydfccl.host.poller) -----------------------------------

    HEARTBEAT_NS = 10_000_000

    def _beat(self, now_ns: int, force: bool = False) -> None:
        """Tell the peers this rank's host is alive (the poller calls it every loop)."""
        if force or now_ns - self._beat_at > self.HEARTBEAT_NS:
            self._row["heartbeat"] = now_ns
            self._beat_at = now_ns

    def _needs_polling(self) -> bool:
        return self._state == "started" and self._error is None and (
            self._outstanding() > 0 or bool(self._row["host_blocked"][0])
            or bool(self._unconfirmed))

    def _next_stamp(self) -> tuple[int, int]:
        """(address, value) of the CQ stamp that announces this rank's next completion."""
        head = self._cq_head
        return self._cq_stamp_addr + (head % L.CQ_CAP) * self._cq_stamp_stride, head + 1

    def _poll_once(self) -> bool:
        """Complete what the CQ holds, else look for an abort or a stall; True if any
        future completed. A failure here fails this rank's futures, not the poller. A CQ
        that a thread waiting in ``result()`` drains is left to it: taken from under it,
        that thread would find the drain held and sleep on its future until woken, a
        thread hand-off that costs tens of microseconds."""
        try:
            if self._unconfirmed and self._confirm_late():
                return True
            if not self._helpers and self._drain_cq():
                return True
            if self._row["abort"][0]:
                if self._state == "started":    # a peer's watchdog, or a failed rank
                    self._set_error(self._abort_error())
                return False
            if self._watchdog.check():
                self._set_error(self._abort_error())   # a deadlock, or a peer that died
            elif self.persistent and self._outstanding():
                self._launcher.check()      # raises LauncherError if a launch was lost
        except LauncherError as exc:        # its peers would wait for it: abort them too
            self._fail_everywhere(exc)
        except Exception as exc:
            self._set_error(PydfcclError(f"rank {self.rank}: completion poller failed: {exc!r}"))
        return False

    def _confirm_late(self) -> bool:
        """Compare late registrations with what the peers published; submit the first run
        of each one confirmed. A difference, or a peer that never publishes, aborts every
        rank with a report that names it. True if a run was submitted."""
        submitted = False
        registered = self.world.ctl["registered"]
        for index, since in list(self._unconfirmed.items()):
            try:
                missing = late_verdict(registered, index, self.rank)
            except ValueError as exc:
                self._fail_everywhere(exc)
                return False
            if missing:
                if time.monotonic() - since > self._late_timeout:
                    spec = self._specs[self._by_index[index]]
                    self._fail_everywhere(ValueError(
                        f"collective {spec.coll_id} ({spec.kind}, count {spec.count}, "
                        f"{spec.dtype}) was prepared on rank {self.rank} but not on ranks "
                        f"{missing} within {self._late_timeout:.0f} s: the ranks' calls differ "
                        "(every rank must issue a group's collectives in the same order)"))
                    return False
                continue
            with self._lock:
                del self._unconfirmed[index]
                first = self._error is None and self._submit_waiting(index) > 0
            if first and not self.persistent:
                self._launch_once()
            submitted = submitted or bool(first)
        return submitted

    def _fail_everywhere(self, error: Exception) -> None:
        """Abort every rank with ``error``'s text as the report (the first report stays)."""
        self.world.abort_with(f"rank {self.rank}: {error}")
        self._set_error(error)

    def _help_until_done(self, future, timeout) -> None:
        """Drain the CQ from the calling thread until ``future`` is done (or a short while).
        The thread watches the next stamp without the GIL and drains as soon as it is there.
        Only a stamp that is there but that this thread could not drain (another thread
        waiting on this communicator holds the drain; the poller leaves it to them) makes
        it sleep on the future, rather than spin against that thread for the GIL. Until
        2026-11-30 a stamp seen by its own watch put it to sleep too, so every completion
        waited for the poller's next turn (up to 100 us, ``progress.SLEEP_WHEN_HELPED``
        then)."""
        if future.finished or self._state != "started":
            return
        spin = CollectiveFuture.SPIN_SECONDS
        end = time.perf_counter() + (spin if timeout is None else min(spin, timeout))
        self._helpers += 1
        try:
            seen = False       # the stamp was there at this thread's last look
            while not future.finished and time.perf_counter() < end:
                if self._drain_cq():
                    seen = False
                elif seen:     # there, yet not drained here: another thread drains it
                    wait_for_futures([future], timeout=1e-3)
                    seen = False
                else:
                    seen = wait_for_stamp(*self._next_stamp(), SPINS_PER_CALL)
        finally:
            self._helpers -= 1
            if future.finished:   # it drained for itself and is likely back for the next one;
                #                 a thread that gave up waits for the poller, which must not
                #                 take it for a helper and sleep
                self._helped_at = time.perf_counter()

    def _drain_cq(self) -> int:
        """Complete the futures of new CQ entries; any host thread may call it."""
        if not self._drain_lock.acquire(blocking=False):
            return 0
        try:
            return self._drain_cq_locked()
        finally:
            self._drain_lock.release()

    def _drain_cq_locked(self) -> int:
        done = []
        while True:
            slot = self._cq_head % L.CQ_CAP
            if self._cq_stamp[slot] != self._cq_head + 1:
                break
            index = int(self._cq_coll[slot])
            with self._lock:    # the head and the count move together: _undone reads both
                self._cq_head += 1
                future, buffers = self._inflight[index].popleft()
                self._completed += 1
                self._completed_word[0] = self._completed
                resubmitted = self._submit_waiting(index) > 0
                if not self.persistent and not self._outstanding():
                    self._launcher.all_done()   # no kernel of this rank waits for a peer
            if resubmitted and not self.persistent:
                self._launch_once()
            done.append((index, future, buffers))
        if done:
            count = len(done)
            self._complete(done)
            return count
        return 0

    def _complete(self, done: list) -> None:
        """Set the futures of ``done`` (and empty it). Device memory must not be freed on
        this thread (the poller, or a thread waiting in ``result()``): ``cuMemFree`` waits
        for every kernel on the device, a daemon that never quits among them. A free can
        happen here when the user dropped a run's buffers (this holds their last reference),
        in a done-callback, or under a daemon that never quits; only then are Numba's frees
        held (``platform.deferred_frees``), which costs microseconds per completion."""
        risky = not self.policy.quits
        dropped = []
        for _, future, buffers in done:
            roles = dropped_by_user(buffers)    # before set_result, which holds recv
            dropped.append(roles)
            risky = risky or future.has_callbacks or bool(roles)
        with platform.deferred_frees() if risky else nullcontext():
            for (index, future, buffers), roles in zip(done, dropped):
                for role in roles:
                    self._dropped_buffers += 1
                    logger.warning("rank %d: collective %d's %s buffer was dropped by the "
                                   "user before the collective completed; pydfccl kept it "
                                   "alive until then", self.rank, self._by_index[index], role)
                future.set_result(buffers[1])
            done.clear()

    def _set_error(self, error: Exception) -> None:
        with self._lock:
            if self._error is None:
                self._error = error
                logger.warning("rank %d: %s", self.rank, error)
        self._fail_all(self._error)

    def _fail_all(self, error: Exception) -> None:
        with self._lock:
            futures = [f for runs in self._inflight.values() for f, _ in runs]
            futures += [item[0] for queue in self._pending.values() for item in queue]
            self._inflight.clear()
            self._pending.clear()
            if self._launcher is not None:
                self._launcher.notify()
        for future in futures:
            if not future.done():
                future.set_exception(error)

    # -- helpers -----------------------------------------------------------------------------

    def _require_started_once(self, what: str) -> None:
        if not hasattr(self, "_tracer"):
            raise PydfcclError(f"{what}() is only allowed after start()")

    def _require(self, state: str, what: str) -> None:
        if self._state != state:
            hints = {"preparing": "before start()", "started": "after start() and before close()"}
            raise PydfcclError(f"{what}() is only allowed {hints[state]}; "
                               f"this communicator is {self._state}")

    def _describe_coll(self, index: int, rank: int | None = None) -> str:
        """The collective at table ``index`` as ``rank`` (default: this one) runs it."""
        if index not in self._by_index:
            return f"collective #{index}"
        coll_id = self._by_index[index]
        spec = self._specs.get(coll_id)      # None: another rank's point-to-point transfer
        if spec is None:
            return f"collective {coll_id}"
        kind = spec.kind
        if kind in POINT_TO_POINT and rank not in (None, self.rank):
            kind = "recv" if kind == "send" else "send"     # the other end of the transfer
        return f"{kind} {coll_id}"

    def __repr__(self):
        return (f"<pydfccl.Communicator rank {self.rank}/{self.nranks} {self._state} "
                f"policy={self.policy.name}>")

