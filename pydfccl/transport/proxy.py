"""The network proxy: a thread per world in each process that carries its rank's
connectors to the ranks of other nodes over MPI (NCCL's net proxy, in Python).

The daemon of rank r writes the connectors of a remote peer p into p's *shadow* in r's
host memory (``World.pools[p]``): slots and tails where it sends to p, heads where it
receives from p. The proxy of r watches the shadows' counter words and, for each one that
moved, sends p's proxy a message: for a tail, one per slot it covers with the slot's bytes
(a one-shot all_reduce's lane of it) and the new tail; for a head, its value. p's proxy
writes the bytes into p's own pool and then the counter (data before flag), at the same
offsets: a connector's place in a pool is the same on every rank. A message is an 8-word
header (its last word: when the sender's proxy sent it, for ``timings``) and a payload, sent
with ``Isend`` on a communicator of the proxies' own (a ``Dup`` of the job's, so that the
user's MPI traffic cannot match it); each peer has one ``Irecv`` posted at a time, and MPI
keeps a pair's messages in order.

Beside the connectors it sends its rank's control row every ``rows.ROW_PERIOD`` seconds,
the abort report once the world has one, and a goodbye when its communicator closes. The
first row that shows the rank started (a heartbeat) goes to a peer before any slot or head
does: MPI keeps a pair's messages in order, so a peer that received this rank's data has
heard it is alive, and a rank that stops right after its first collective, inside the
row period, is still named by the ranks of other nodes rather than taken for one that
never started.

A slot's bytes in a shadow are intact until the proxy has sent them: the daemon writes slot
k + nslots only after the receiver's head said slot k was consumed, which it can only be
once the proxy sent it.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from ..log import logger
from ..protocol import layout as L
from ..protocol.collectives import ONE_SHOT
from ..protocol.one_shot import lane_bytes
from .rows import ROW_MESSAGE_BYTES, ROW_PERIOD, apply_row, row_bytes
from .timings import ProxyTimings

__all__ = ["NetProxy", "TAG", "SLOT", "HEAD", "ROW", "ABORT", "BYE"]

TAG = 38
SLOT, HEAD, ROW, ABORT, BYE = 1, 2, 3, 4, 5      # a message's kind: its header's word 0
_KINDS = {SLOT: "slot", HEAD: "head", ROW: "row", ABORT: "abort", BYE: "bye"}
HEADER_WORDS = 8
_LANES = L.CONN_LANES
CLOSE_WAIT_S = 10.0    # at close, how long the proxy waits for its last sends


class NetProxy:
    """The proxy of rank ``rank`` of ``world`` on ``comm`` (an mpi4py communicator of the
    job's ranks, the proxies' own; ``mpi``: the module of its ``BYTE`` and ``Status``).
    ``start()`` starts its thread; ``close()`` sends what is left, says goodbye and stops
    it. ``stats`` counts messages by kind, sent and received (tests check that a pair
    across nodes really goes through MPI); ``delivered`` counts the slots and credits
    written into the rank's pool (``World.activity``); ``timings`` shows where its time
    goes (``timings.ProxyTimings``)."""

    def __init__(self, world, rank: int, comm, idle_sleep: float = 5e-4, mpi=None):
        if mpi is None:         # a stand-in's (BYTE, Status) for tests without MPI
            from mpi4py import MPI as mpi
        self._mpi = mpi
        self.world, self.rank, self.comm = world, rank, comm
        cfg = world.config
        self.peers = sorted(world.remote)
        self._nconn = cfg.max_colls * cfg.nblocks
        self._stride = cfg.conn_stride
        self._idle_sleep = idle_sleep
        self._own = world.pools[rank]
        self._tails, self._heads, self._sent = {}, {}, {}
        for p in self.peers:
            conns = world.pools[p].array[L.HEADER_BYTES:L.HEADER_BYTES
                                         + self._nconn * self._stride]
            conns = conns.reshape(self._nconn, self._stride)
            self._tails[p] = conns[:, L.CONN_TAIL:L.CONN_TAIL + 8 * _LANES].view(np.int64)
            self._heads[p] = conns[:, L.CONN_HEAD:L.CONN_HEAD + 8 * _LANES].view(np.int64)
            self._sent[p] = (np.zeros((self._nconn, _LANES), np.int64),
                             np.zeros((self._nconn, _LANES), np.int64))
        payload = max(cfg.slot_bytes, ROW_MESSAGE_BYTES, 8192)
        self._max_bytes = 8 * HEADER_WORDS + payload
        self._recv_bufs = {p: np.empty(self._max_bytes, np.uint8) for p in self.peers}
        self._recvs = {}
        self._sends: list = []          # (request, buffer) until the send completes
        self._rows_out: dict = {}       # peer -> the request of the last row sent to it
        self._told_started: set[int] = set()     # peers sent a row with a live heartbeat
        self._heartbeat = world.ctl["heartbeat"][rank:rank + 1]
        self._one_shot: dict[int, bool] = {}     # connector set -> one-shot all_reduce?
        self._gone: set[int] = set()             # peers that said goodbye
        self._abort_sent = False
        self.stats = {f"{way}_{kind}": 0 for way in ("sent", "received")
                      for kind in _KINDS.values()}
        self.delivered = 0      # slots and credits written into this rank's pool
        self.timings = ProxyTimings()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pydfccl-net-{rank}",
                                        daemon=True)
        self.error: BaseException | None = None

    # -- life --------------------------------------------------------------------------------

    def start(self) -> None:
        for p in self.peers:
            self._post_recv(p)
        self._thread.start()

    def close(self) -> None:
        """Send what the daemon left in the shadows, this rank's last row and a goodbye;
        wait (up to CLOSE_WAIT_S) for the sends, then stop."""
        if not self._thread.is_alive():
            return
        self._stop.set()
        self._thread.join(CLOSE_WAIT_S + 5)

    def _run(self) -> None:
        from .. import platform

        next_row, last = 0.0, None
        try:
            platform.bind_thread()      # its copies into the pool: the process's GPU
            while not self._stop.is_set():
                began = time.perf_counter()
                if last is not None:
                    self.timings.add("loop gap", began - last)
                last = began
                busy = self._forward() + self._receive()
                now = time.monotonic()
                if now >= next_row:
                    self._send_row()
                    next_row = now + ROW_PERIOD
                self._forward_abort()
                self._reap()
                if not busy:
                    time.sleep(self._idle_sleep)
            self._finish()
        except BaseException as exc:      # the world learns it: a silent proxy would hang it
            self.error = exc
            logger.exception("rank %d: network proxy failed", self.rank)
            self.world.abort_with(f"rank {self.rank}: its network proxy failed: "
                                  f"{type(exc).__name__}: {exc}")

    def _finish(self) -> None:
        self._forward()
        self._receive()
        self._send_row(last_one=True)
        self._forward_abort()
        for p in self.peers:
            if p not in self._gone:
                self._send(p, BYE)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._sends and time.monotonic() < deadline:
            self._receive()
            self._reap()
            time.sleep(self._idle_sleep)
        if self._sends:
            logger.warning("rank %d: %d network messages still unsent at close",
                           self.rank, len(self._sends))
        for request in self._recvs.values():
            request.Cancel()
        for request in self._recvs.values():
            request.Wait()

    # -- sending -----------------------------------------------------------------------------

    def _send(self, peer: int, kind: int, words=(), payload=None):
        """Post a message to ``peer``; its request (None: the peer said goodbye)."""
        if peer in self._gone:
            return None
        header = np.zeros(HEADER_WORDS, np.int64)
        header[0] = kind
        header[1:1 + len(words)] = words
        header[-1] = time.monotonic_ns()
        buf = header.view(np.uint8)
        if payload is not None:
            buf = np.concatenate([buf, np.ascontiguousarray(payload).view(np.uint8)])
        request = self.comm.Isend([buf, self._mpi.BYTE], dest=peer, tag=TAG)
        self._sends.append((request, buf))
        self.stats[f"sent_{_KINDS[kind]}"] += 1
        return request

    def _reap(self) -> None:
        if self._sends:
            self._sends = [(r, b) for r, b in self._sends if not r.Test()]

    def _forward(self) -> int:
        """Send every counter that moved in a shadow since the last look; the number sent."""
        moved = 0
        for p in self.peers:
            tails, heads = self._tails[p], self._heads[p]
            sent_tails, sent_heads = self._sent[p]
            if p not in self._told_started and not (np.array_equal(tails, sent_tails)
                                                     and np.array_equal(heads, sent_heads)):
                self._tell_started(p)
            for conn, lane in np.argwhere(tails != sent_tails):
                now, was = int(tails[conn, lane]), int(sent_tails[conn, lane])
                for value in range(was + 1, now + 1):
                    self._send_slot(p, int(conn), int(lane), value)
                sent_tails[conn, lane] = now
                moved += 1
            for conn, lane in np.argwhere(heads != sent_heads):
                value = int(heads[conn, lane])
                self._send(p, HEAD, (conn, lane, value))
                sent_heads[conn, lane] = value
                moved += 1
        return moved

    def _slot_span(self, conn: int, lane: int, value: int) -> tuple[int, int]:
        """(offset in the pool, bytes) of the slot that tail ``value`` of ``lane`` of
        connector ``conn`` publishes: the whole slot, or a one-shot all_reduce's lane."""
        cfg = self.world.config
        slot = (value - 1) % cfg.nslots
        offset = L.HEADER_BYTES + conn * self._stride + L.CONN_HEADER_BYTES \
            + slot * cfg.slot_bytes
        if lane == 0 and not self._is_one_shot(conn // cfg.nblocks):
            return offset, cfg.slot_bytes
        width = lane_bytes(cfg.nranks, cfg.slot_bytes)
        return offset + lane * width, width

    def _is_one_shot(self, conn_set: int) -> bool:
        """Whether connector set ``conn_set`` is a one-shot all_reduce's, from this rank's
        collective table (every rank registers it alike; read again for a set not seen)."""
        if conn_set not in self._one_shot:
            table = self._own.read(L.P_COLLS, L.MAX_COLLS * L.COLL_ENTRY.itemsize)
            table = table.view(L.COLL_ENTRY)
            shots = {int(e["conn"]) for e in table if int(e["kind"]) == ONE_SHOT}
            self._one_shot[conn_set] = conn_set in shots
        return self._one_shot[conn_set]

    def _send_slot(self, peer: int, conn: int, lane: int, value: int) -> None:
        offset, nbytes = self._slot_span(conn, lane, value)
        data = self.world.pools[peer].array[offset:offset + nbytes]
        self._send(peer, SLOT, (conn, lane, value, offset, nbytes), data)

    def _send_row(self, last_one: bool = False) -> None:
        """This rank's row to each peer whose last one has gone out. Rows to a peer that
        receives nothing (a stopped process) would pile up in MPI's buffers, 20 a second,
        until MPI could send to no one: a stopped rank's peers then stopped hearing the
        live ranks of its node and named them instead. A newer row replaces an unsent one
        anyway. ``last_one``: the row at close goes to every peer (its heartbeat says the
        rank closed on purpose, ``liveness.closed_peers``)."""
        started = self._heartbeat[0] > 0
        payload = row_bytes(self.world, self.rank)
        for p in self.peers:
            last = self._rows_out.get(p)
            if last_one or last is None or last.Test():
                self._rows_out[p] = self._send(p, ROW, (), payload)
                if started:
                    self._told_started.add(p)

    def _tell_started(self, peer: int) -> None:
        """This rank's row to ``peer`` ahead of its data, once the row says it started
        (read after the shadows moved, so a collective's data finds it set)."""
        if self._heartbeat[0] > 0:
            self._rows_out[peer] = self._send(peer, ROW, (), row_bytes(self.world, self.rank))
            self._told_started.add(peer)

    def _forward_abort(self) -> None:
        if self._abort_sent or not self.world.report[0]:
            return
        self._abort_sent = True
        report = np.frombuffer(self.world.get_report().encode(), np.uint8)
        for p in self.peers:
            self._send(p, ABORT, (report.size,), report)

    # -- receiving ---------------------------------------------------------------------------

    def _post_recv(self, peer: int) -> None:
        self._recvs[peer] = self.comm.Irecv([self._recv_bufs[peer], self._mpi.BYTE],
                                            source=peer, tag=TAG)

    def _receive(self) -> int:
        """Handle every message that arrived; the number handled."""
        handled = 0
        status = self._mpi.Status()
        for p in self.peers:
            while p in self._recvs and self._recvs[p].Test(status):
                size = status.Get_count(self._mpi.BYTE)
                self._handle(p, self._recv_bufs[p][:size])
                handled += 1
                if p in self._gone:
                    del self._recvs[p]
                else:
                    self._post_recv(p)
        return handled

    def _handle(self, peer: int, message: np.ndarray) -> None:
        header = message[:8 * HEADER_WORDS].view(np.int64)
        payload = message[8 * HEADER_WORDS:]
        kind = int(header[0])
        self.stats[f"received_{_KINDS[kind]}"] += 1
        if kind in (SLOT, HEAD):
            self.timings.add("transit", (time.monotonic_ns() - int(header[-1])) / 1e9)
        if kind == SLOT:
            conn, lane, value, offset, nbytes = (int(w) for w in header[1:6])
            began = time.perf_counter()
            self._own.write(offset, payload[:nbytes])       # the data, then its tail
            self._own.write(self._counter(conn, L.CONN_TAIL, lane), np.int64([value]))
            self.timings.add("pool write", time.perf_counter() - began)
            self.delivered += 1          # a daemon that quit waiting for it: relaunch now
        elif kind == HEAD:
            conn, lane, value = (int(w) for w in header[1:4])
            self._own.write(self._counter(conn, L.CONN_HEAD, lane), np.int64([value]))
            self.delivered += 1
        elif kind == ROW:
            apply_row(self.world, peer, payload, int(header[-1]))
        elif kind == ABORT:
            self._abort_sent = True      # its sender told every node
            self.world.abort_with(bytes(payload[:int(header[1])]).decode(errors="replace"))
        elif kind == BYE:
            self._gone.add(peer)

    def _counter(self, conn: int, where: int, lane: int) -> int:
        return L.HEADER_BYTES + conn * self._stride + where + 8 * lane
