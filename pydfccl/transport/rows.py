"""The control rows of ranks on other nodes, as replicas in this node's rows.

A rank's host reads more of its peers than their pools: the watchdog reads every rank's
block status and progress, liveness its pid and heartbeat, late registrations what it
published, the launcher the activity of all. Within a node these are the peers' own rows
in the node's shared segment. For a rank on another node the row here is a replica: its
proxy sends the part of its row that its host and daemon write (``row_bytes``) every
``ROW_PERIOD`` seconds and when it closes, and the proxies of this node write it in
(``apply_row``). Each rank of this node receives the peer's rows through its own proxy,
so they reach the replica by several paths, each in order but not with each other: a row
older than the one in place (its send time, on the sender's clock, is kept in the
replica's ``row_sent``) is dropped, or a path that lags would set the replica back, to
a heartbeat of 0 from before the peer started, say, and a stopped peer would then never
be named. The replica's heartbeat is the time it arrived here, and its pid
namespace -1, which no process here has: ``host.liveness`` then judges the peer by that
heartbeat (``PYDFCCL_HEARTBEAT_TIMEOUT``) rather than by a pid of another machine. The
SQ, the CQ and the abort word stay each node's own: a remote daemon reads none of them, and
an abort travels as a report (``proxy.NetProxy``) that each node's proxies apply with
``World.abort_with``.
"""

from __future__ import annotations

import time

import numpy as np

from ..host.liveness import REMOTE_NS
from ..protocol import layout as L

__all__ = ["ROW_PERIOD", "row_bytes", "apply_row", "ROW_MESSAGE_BYTES"]

ROW_PERIOD = 0.05     # seconds between a proxy's copies of its rank's row

# What a remote host reads: host_blocked .. the block statuses, and the registrations.
_HEAD = (L.word(L.CTL_ROW, "host_blocked"), L.CTL_BLOCKS + L.MAX_BLOCKS * L.BS_SIZE)
_REG = (L.word(L.CTL_ROW, "registered"),
        L.word(L.CTL_ROW, "registered") + L.MAX_COLLS * L.REGISTRATION.itemsize)
ROW_MESSAGE_BYTES = (_HEAD[1] - _HEAD[0]) + (_REG[1] - _REG[0])
_HEARTBEAT = L.word(L.CTL_ROW, "heartbeat")
_PID_NS = L.word(L.CTL_ROW, "pid_ns")
_ROW_SENT = L.word(L.CTL_ROW, "row_sent")


def _raw_row(world, rank: int) -> np.ndarray:
    """Rank ``rank``'s control row in this node's segment, as bytes."""
    size = L.CTL_ROW.itemsize
    return world.ctl_bytes_view[rank * size:(rank + 1) * size]


def row_bytes(world, rank: int) -> np.ndarray:
    """The replicated part of rank ``rank``'s row (a copy)."""
    raw = _raw_row(world, rank)
    return np.concatenate([raw[_HEAD[0]:_HEAD[1]], raw[_REG[0]:_REG[1]]])


def apply_row(world, rank: int, payload: np.ndarray, sent_ns: int) -> bool:
    """Write a row that rank ``rank``'s proxy sent at ``sent_ns`` (its clock) into its
    replica here, unless the replica holds a newer one; whether it was written."""
    raw = _raw_row(world, rank)
    words = raw.view(np.int64)
    if sent_ns <= words[_ROW_SENT // 8]:     # another proxy of this node wrote a newer one
        return False
    words[_ROW_SENT // 8] = sent_ns
    split = _HEAD[1] - _HEAD[0]
    raw[_REG[0]:_REG[1]] = payload[split:]
    raw[_HEAD[0]:_HEAD[1]] = payload[:split]
    if words[_HEARTBEAT // 8] > 0:          # alive: the time it was last heard of, here
        words[_HEARTBEAT // 8] = time.monotonic_ns()
    words[_PID_NS // 8] = REMOTE_NS          # its pid names no process of this node
    return True
