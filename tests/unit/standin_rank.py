"""A rank's host side without a daemon, for the unit tests: its submissions and completion
queue over a control row in host memory, and a stand-in daemon that takes SQ entries and
posts CQ entries as the real one does (the stamp last)."""

import threading
from types import SimpleNamespace

import numpy as np

from pydfccl.host.completion import CompletionQueue
from pydfccl.host.futures import CollectiveFuture
from pydfccl.host.rankstate import Phase, RankState
from pydfccl.host.submission import Submissions
from pydfccl.protocol import layout as L

__all__ = ["Daemon", "Rank"]


class Daemon:
    """Takes the rank's SQ entries in order and completes them: CQ coll, then the stamp."""

    def __init__(self, ctl, rank=0):
        self.sq, self.cq = ctl["sq"][rank], ctl["cq"][rank]
        self.taken = 0

    def complete(self, n=1) -> list:
        """Complete the next ``n`` runs in the SQ; their table indices."""
        done = []
        for _ in range(n):
            slot = self.taken % L.SQ_CAP
            assert self.sq["seq"][slot] == self.taken + 1, "no such run in the SQ"
            index = int(self.sq["coll"][slot])
            self.cq["coll"][self.taken % L.CQ_CAP] = index
            self.cq["stamp"][self.taken % L.CQ_CAP] = self.taken + 1
            self.taken += 1
            done.append(index)
        return done


class Rank:
    """A rank's submissions and CQ over one control row, started."""

    def __init__(self, quits=True):
        self.ctl = np.zeros(1, L.CTL_ROW)
        self.lock = threading.Lock()
        self.sub = Submissions(self.ctl, 0, self.lock)
        world = SimpleNamespace(get_report=lambda: "", abort_with=lambda report: report)
        self.state = RankState(world, 0, self.lock, self.sub.fail_all)
        self.state.phase = Phase.STARTED
        self.cq = CompletionQueue(self.ctl, 0, self.lock, self.sub, self.state,
                                  {0: 10, 1: 11}, quits)
        self.daemon = Daemon(self.ctl)
        self.buffers = []       # held, as a user holds them: not reported as dropped

    def run(self, index=0):
        future = CollectiveFuture(self.cq, running=True)
        send = recv = np.zeros(2)
        self.buffers.append(send)
        with self.lock:
            self.sub.add(index, future, send.ctypes.data, recv.ctypes.data, 0, (send, recv))
        return future
