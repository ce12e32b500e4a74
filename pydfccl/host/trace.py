"""The daemons' event logs: drained from each block's ring in the pool, turned into plain
records and into a Chrome-trace / Perfetto timeline (one track per rank and block)."""

from __future__ import annotations

import collections
import os
import threading

import numpy as np

from ..protocol import layout as L

__all__ = ["TraceReader", "TRACE_KEEP", "TRACE_DRAIN_SECONDS", "next_drain_interval",
           "HOST_TRACK", "MARK_SUBMITTING", "MARK_RUN",
           "MARK_RESULT", "host_mark", "clock_offset_ns", "on_daemon_clock", "primitive_name",
           "to_chrome", "plot_timeline"]

HOST_TRACK = -1    # the block number of a rank's host marks: their own track, "host"


def primitive_name(flags: int) -> str:
    """NCCL's name for a step's primitive ("recvReduceSend", ...) from its flags."""
    from ..kernels import plans
    from ..kernels import primitives as P

    names = {P.SEND: "send", P.RECV_REDUCE_SEND: "recvReduceSend",
             P.RECV_REDUCE_COPY_SEND: "recvReduceCopySend", P.RECV_COPY_SEND: "recvCopySend",
             P.RECV: "recv", P.COPY: "copy", plans.SEND_ALL: "sendAll",
             plans.RECV_REDUCE_ALL: "recvReduceCopyAll"}
    return names.get(flags) or names.get(flags | P.F_POSTDIV) or f"flags {flags}"


TRACE_KEEP = int(os.environ.get("PYDFCCL_TRACE_KEEP", "200000"))
TRACE_DRAIN_SECONDS = (0.01, 0.2)   # the shortest and longest wait between two drains


def next_drain_interval(interval: float, most_new: int) -> float:
    """The wait before the next drain, after one that found at most ``most_new`` records in
    a block's ring following a wait of ``interval``. Every drain is device copies that take
    and give back the GIL, which ranks that are threads of one process wait for: a quarter
    of the ring or more, the shortest wait; under an eighth, twice as long (the ring then
    fills to a quarter at that rate), up to the longest. A burst faster than that can
    still overwrite records before they are read; ``lost`` counts them."""
    shortest, longest = TRACE_DRAIN_SECONDS
    if 4 * most_new >= L.TRACE_CAP:
        return shortest
    if 8 * most_new < L.TRACE_CAP:
        return min(2 * interval, longest)
    return interval


class TraceReader:
    """Reads new records from one rank's block logs, and keeps the latest ``keep`` of them.

    A thread of the poller's drains the device rings while work goes on, every 10 ms to
    200 ms as they fill (``next_drain_interval``), so that none wraps; what it reads stays
    as the raw 48-byte records, and only ``events()`` (``comm.trace()``) turns them into
    dicts. A communicator that runs for days would otherwise hold every event it ever had:
    ``keep`` bounds that (PYDFCCL_TRACE_KEEP, about 10 MB by default), and ``lost`` counts
    records overwritten in a ring before they were read, ``dropped`` the oldest ones let go
    on the host."""

    def __init__(self, pool, rank: int, nblocks: int, coll_ids: dict, keep: int = TRACE_KEEP):
        self.pool, self.rank, self.nblocks, self.coll_ids = pool, rank, nblocks, coll_ids
        self.keep = keep
        self.read = [0] * nblocks
        self._chunks: collections.deque = collections.deque()   # (block, records)
        self._kept = 0
        self.lost = 0          # records overwritten before they were read
        self.dropped = 0       # records read, then let go to stay within ``keep``
        self._lock = threading.Lock()

    def _heads(self) -> np.ndarray:
        return self.pool.read(L.P_TRACE_HEAD, 8 * self.nblocks).view(np.int64)

    def _slots(self, block: int, first: int, end: int) -> np.ndarray:
        """Records ``first`` to ``end`` (exclusive, counted since launch) of one block's ring,
        copied in at most two pieces: only what is new crosses from the device."""
        cap, size = L.TRACE_CAP, L.TRACE_SIZE
        pieces, i = [], first
        while i < end:
            slot = i % cap
            n = min(end - i, cap - slot)
            raw = self.pool.read(L.P_TRACE + (block * cap + slot) * size, n * size)
            pieces.append(raw.view(L.TRACE_EVENT))
            i += n
        return np.concatenate(pieces) if pieces else np.empty(0, L.TRACE_EVENT)

    @property
    def missing(self) -> int:
        """Records not kept: overwritten before they were read, or let go since."""
        return self.lost + self.dropped

    def close(self) -> None:
        """No device reads from now on (the pool may be freed next): waits for a drain in
        progress. The records kept so far stay readable."""
        with self._lock:
            self.pool = None

    def drain(self) -> int:
        """Copy the new records of every block (the poller calls this); the most any block
        had, by which the poller paces its drains (``next_drain_interval``)."""
        with self._lock:
            if self.pool is None:
                return 0
            heads = [int(h) for h in self._heads()]
            copied = []
            for b, head in enumerate(heads):
                first = max(self.read[b], head - L.TRACE_CAP)
                copied.append((first, self._slots(b, first, head)))
            # Records older than (head now - CAP) may have been overwritten while copying.
            after = self._heads()
            for b, (head, (first, records)) in enumerate(zip(heads, copied)):
                valid = max(first, int(after[b]) - L.TRACE_CAP)
                self.lost += valid - self.read[b]
                self._keep_records(b, records[valid - first:])
            most = max((h - r for h, r in zip(heads, self.read)), default=0)
            self.read = heads
            return most

    def _keep_records(self, block: int, records: np.ndarray) -> None:
        if len(records):
            self._chunks.append((block, records))
            self._kept += len(records)
        while self._kept > self.keep:
            b, oldest = self._chunks[0]
            excess = min(self._kept - self.keep, len(oldest))
            if excess == len(oldest):
                self._chunks.popleft()
            else:
                self._chunks[0] = (b, oldest[excess:])
            self._kept -= excess
            self.dropped += excess

    def events(self) -> list[dict]:
        """The kept events, oldest first per block, as dicts (after a last drain)."""
        self.drain()
        with self._lock:
            return [self._event(b, rec) for b, records in self._chunks for rec in records]

    def _event(self, block: int, rec) -> dict:
        coll = int(rec["coll"])
        loop, step = L.unpack_step(int(rec["detail"]))
        event = dict(t_ns=int(rec["t"]), rank=self.rank, block=block,
                     event=L.TRACE_KINDS.get(int(rec["event"]), "unknown"),
                     coll=self.coll_ids.get(coll) if coll >= 0 else None,
                     loop=loop, step=step)
        if event["event"] == "launched":      # its detail is the block's multiprocessor
            event.update(loop=0, step=0, sm=int(rec["detail"]))
        elif event["event"] == "preempted":
            event.update(primitive=primitive_name(int(rec["flags"])),
                         waited_ns=int(rec["waited"]))
        return event


# The host marks that bound a run's time on the daemon's clock (``clock_offset_ns``):
# the host begins submitting an iteration (``loop``), has submitted a run of ``coll``,
# has its result.
MARK_SUBMITTING, MARK_RUN, MARK_RESULT = "host: submitting", "host: run() returned", \
    "host: result"


def host_mark(rank: int, what: str, coll=None, loop: int = 0) -> dict:
    """An event of the rank's host, now, in the form of the daemons' (``events()``), on
    the host's reading of their clock (``platform.event_clock_ns``; ``clock_offset_ns``
    then corrects it), so that a timeline shows where the host's time went beside the
    GPU's: ``what`` names it ("host: ..."), ``coll`` the collective."""
    from .. import platform      # a rank's, loaded by then; not the launcher's to import

    return dict(t_ns=platform.event_clock_ns(), rank=rank, block=HOST_TRACK, event=what,
                coll=coll, loop=loop, step=0)


def clock_offset_ns(marks: list[dict], events: list[dict]) -> int:
    """How far one rank's daemon clock reads ahead of its host's, as its host ``marks`` and
    daemon ``events`` show. A GPU's %globaltimer is not the host's clock (hundreds of
    microseconds apart on an H200, and the gap drifts), so the offset
    is read off the runs: block 0 (every collective's first channel) absorbs a
    collective's nth run after the host mark before that run's MARK_RUN (the host
    submitted the run after making it), and completes the run before the host has its
    result. Each run bounds the offset from both sides; this is the middle of the tightest
    bounds. A collective whose runs and events do not pair up one to one (a log that lost
    events) is left out; with no pairs, 0."""
    marks = sorted(marks, key=lambda m: m["t_ns"])
    block0 = sorted((e for e in events if e["block"] == 0), key=lambda e: e["t_ns"])
    above, below = [], []        # offset <= each of above, offset >= each of below
    for coll in {m["coll"] for m in marks if m["event"] == MARK_RUN}:
        before = [marks[i - 1]["t_ns"] for i, m in enumerate(marks)
                  if i > 0 and m["event"] == MARK_RUN and m["coll"] == coll]
        results = [m["t_ns"] for m in marks if m["event"] == MARK_RESULT and m["coll"] == coll]
        absorbed = [e["t_ns"] for e in block0 if e["event"] == "absorbed" and e["coll"] == coll]
        completed = [e["t_ns"] for e in block0
                     if e["event"] == "completed" and e["coll"] == coll]
        if len(before) == len(results) == len(absorbed) == len(completed):
            above += [a - b for a, b in zip(absorbed, before)]
            below += [c - r for c, r in zip(completed, results)]
    return (min(above) + max(below)) // 2 if above else 0


def on_daemon_clock(marks: list[dict], offset_ns: int) -> list[dict]:
    """One rank's host ``marks`` moved onto its daemon's clock (``clock_offset_ns``)."""
    return [dict(m, t_ns=m["t_ns"] + offset_ns) for m in marks]


def to_chrome(events: list[dict], names: dict | None = None) -> dict:
    """Chrome-trace JSON (``chrome://tracing``, ui.perfetto.dev): a slice per stretch a
    block ran a collective (from loaded to preempted or completed), instants for the rest."""
    if not events:
        return {"traceEvents": []}
    names = names or {}
    t0 = min(e["t_ns"] for e in events)
    out, running = [], {}
    for e in sorted(events, key=lambda e: (e["rank"], e["block"], e["t_ns"])):
        track = (e["rank"], e["block"])
        ts = (e["t_ns"] - t0) / 1e3
        label = names.get(e["coll"], f"collective {e['coll']}")
        if e["event"] == "loaded":
            running[track] = (ts, e)
        elif e["event"] in ("preempted", "completed") and track in running:
            start, loaded = running.pop(track)
            args = dict(ended=e["event"], from_step=loaded["step"], to_step=e["step"],
                        loop=e["loop"])
            if "primitive" in e:
                args.update(primitive=e["primitive"], waited_us=e["waited_ns"] / 1e3)
            out.append(dict(name=label, ph="X", ts=start, dur=max(ts - start, 0.001),
                            pid=e["rank"], tid=e["block"], args=args))
        else:
            out.append(dict(name=e["event"] + (f" {label}" if e["coll"] is not None else ""),
                            ph="i", s="t", ts=ts, pid=e["rank"], tid=e["block"]))
    for rank in sorted({e["rank"] for e in events}):
        out.append(dict(name="process_name", ph="M", pid=rank, args=dict(name=f"rank {rank}")))
    for rank in sorted({e["rank"] for e in events if e["block"] == HOST_TRACK}):
        out.append(dict(name="thread_name", ph="M", pid=rank, tid=HOST_TRACK,
                        args=dict(name="host")))
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def plot_timeline(events: list[dict], path: str, title: str = "pydfccl daemons",
                  names: dict | None = None) -> None:
    """A timeline picture: ``pydfccl.cli.pictures.draw_timeline`` (a row per rank and
    block, a colour per collective, preemptions as black crosses, budgets and host marks
    in lanes of their own)."""
    from ..cli.pictures import draw_timeline

    draw_timeline(events, path, title, names)
