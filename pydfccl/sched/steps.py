"""The collectives' step models: the ring's step names, and the state of one collective on
all ranks (an all-reduce, ring or one-shot, or an all_to_allv) that says which step can run
and moves its data."""

from __future__ import annotations

from typing import List, Tuple

from ..protocol.collectives import BY_NAME, ONE_SHOT_STEPS

__all__ = ["ring_steps", "Coll", "RingColl", "OneShotColl", "SplitColl"]


def ring_steps(nranks: int) -> List[Tuple[str, bool, bool]]:
    """The steps of one ring all-reduce loop as ``(name, receives, sends)``."""
    middle = nranks - 2
    return ([("send", False, True)] + [("recvReduceSend", True, True)] * middle
            + [("recvReduceCopySend", True, True)] + [("recvCopySend", True, True)] * middle
            + [("recv", True, False)])


class Coll:
    """One collective's state on all ranks: its steps, slot counters and data. A kind says
    ``nsteps`` and its connectors (``sent``, ``recvd``, ``slots``); ``blockers(r)`` names the
    ranks whose slots rank r's next step waits for (empty: ready), ``do_step(r)`` moves it."""

    __slots__ = ("cid", "count", "n", "nslots", "nsteps", "step", "sent", "recvd", "slots",
                 "own", "out", "done")

    def __init__(self, cid, count, nranks, nslots, own):
        self.cid, self.count = cid, count
        self.n, self.nslots = nranks, nslots
        self.step = [0] * nranks
        self.own = own
        self.out = [[None] * count for _ in range(nranks)]
        self.done = [False] * nranks

    def ready(self, r):
        return not self.blockers(r)


class RingColl(Coll):
    """The ring: connectors rank r -> r+1; a step is ring_step() and chunk_span() of
    pydfccl/kernels/ring.py."""

    __slots__ = ("slot_elems", "width")

    def __init__(self, cid, count, nranks, nslots, slot_elems, own):
        super().__init__(cid, count, nranks, nslots, own)
        self.slot_elems = slot_elems
        self.width = BY_NAME["all_reduce"].steps(nranks)
        self.nsteps = -(-count // (nranks * slot_elems)) * self.width
        self.sent = [0] * nranks     # slots rank r sent to r+1
        self.recvd = [0] * nranks    # slots rank r received from r-1
        self.slots = [[None] * nslots for _ in range(nranks)]  # ring buffer of r -> r+1

    def blockers(self, r):
        k = self.step[r] % self.width
        prev, nxt = (r - 1) % self.n, (r + 1) % self.n
        out = []
        if k > 0 and self.recvd[r] >= self.sent[prev]:
            out.append(prev)
        if k < self.width - 1 and self.sent[r] - self.recvd[nxt] >= self.nslots:
            out.append(nxt)
        return out

    def ready(self, r):
        """``not blockers(r)``, without building the list (the model's hottest check)."""
        k = self.step[r] % self.width
        if k > 0 and self.recvd[r] >= self.sent[(r - 1) % self.n]:
            return False
        return k == self.width - 1 or self.sent[r] - self.recvd[(r + 1) % self.n] < self.nslots

    def do_step(self, r):
        n, width = self.n, self.width
        loop, k = divmod(self.step[r], width)
        chunk = (r - 1 - k) % n
        offset = loop * n * self.slot_elems
        remaining = min(n * self.slot_elems, self.count - offset)
        size = -(-remaining // n)
        lo = offset + chunk * size
        hi = max(lo, min(lo + size, offset + remaining))
        own = self.own[r][lo:hi]
        if k == 0:                                        # send
            data = own
        else:
            prev = (r - 1) % n
            data = self.slots[prev][self.recvd[r] % self.nslots]
            self.recvd[r] += 1
            if k < n:                                     # recvReduce(Copy)Send
                data = [a + b for a, b in zip(data, own)]
            if k >= n - 1:                                # the reduced chunk is final here
                self.out[r][lo:hi] = data
        if k < width - 1:
            self.slots[r][self.sent[r] % self.nslots] = data
            self.sent[r] += 1
        self.step[r] += 1


class OneShotColl(Coll):
    """A one-shot all-reduce: every rank writes its input into a lane of each peer's slots
    (``sendAll``), then sums every rank's input in rank order (``recvReduceCopyAll``). Lane
    (q -> r) has its own ring buffer and counters, as a lane of the daemon's connector has
    its own tail and head words."""

    __slots__ = ()

    def __init__(self, cid, count, nranks, nslots, own):
        super().__init__(cid, count, nranks, nslots, own)
        self.nsteps = ONE_SHOT_STEPS
        self.sent = [[0] * nranks for _ in range(nranks)]     # [q][r]: q's sends to r
        self.recvd = [[0] * nranks for _ in range(nranks)]    # [r][q]: r's receives from q
        self.slots = [[[None] * nslots for _ in range(nranks)] for _ in range(nranks)]

    def blockers(self, r):
        peers = [q for q in range(self.n) if q != r]
        if self.step[r] % 2 == 0:       # sendAll: a free slot in every peer's lane
            return [q for q in peers if self.sent[r][q] - self.recvd[q][r] >= self.nslots]
        return [q for q in peers if self.recvd[r][q] >= self.sent[q][r]]

    def do_step(self, r):
        if self.step[r] % 2 == 0:
            for q in range(self.n):
                if q != r:
                    self.slots[r][q][self.sent[r][q] % self.nslots] = self.own[r]
                    self.sent[r][q] += 1
        else:
            total = [0] * self.count
            for q in range(self.n):     # rank order, as the daemon reduces
                if q == r:
                    data = self.own[r]
                else:
                    data = self.slots[q][r][self.recvd[r][q] % self.nslots]
                    self.recvd[r][q] += 1
                total = [a + b for a, b in zip(total, data)]
            self.out[r] = total
        self.step[r] += 1


def _offsets(sizes):
    out, at = [], 0
    for n in sizes:
        out.append(at)
        at += n
    return out


class SplitColl(Coll):
    """An all_to_allv, as the daemon runs it (kernels/plans.py, ``split_step``): loops of
    ``2n - 1`` steps that cover ``slot_elems`` of every block, its largest (``count``) in
    ``ceil(count / slot_elems)`` loops. Step 0 copies the own block; then for k = 1..n-1 a
    send to rank r+k and a receive from rank r-k through pair k's connector (rank r to
    r+k, a ring buffer of ``nslots`` slots with its own counters). A block that ends
    before a loop sends an empty slot: every pair moves one slot a loop."""

    __slots__ = ("counts", "slot_elems", "width", "send_at", "recv_at")

    def __init__(self, cid, count, counts, nranks, nslots, slot_elems, own):
        super().__init__(cid, count, nranks, nslots, own)
        self.counts, self.slot_elems = counts, slot_elems
        self.width = BY_NAME["all_to_allv"].steps(nranks)
        self.nsteps = -(-count // slot_elems) * self.width
        self.send_at = [_offsets(row) for row in counts]                 # [r][p]
        self.recv_at = [_offsets([row[r] for row in counts]) for r in range(nranks)]
        self.out = [[None] * sum(row[r] for row in counts) for r in range(nranks)]
        self.sent = [[0] * nranks for _ in range(nranks)]     # [r][k]: slots r sent to r+k
        self.recvd = [[0] * nranks for _ in range(nranks)]    # [r][k]: from r-k, received
        self.slots = [[[None] * nslots for _ in range(nranks)] for _ in range(nranks)]

    def _peer(self, r):
        """(k, the step's peer, whether it sends) of rank r's next step; k = 0: the copy."""
        s = self.step[r] % self.width
        k = (s + 1) // 2
        return (k, (r + k) % self.n, True) if s % 2 else (k, (r - k) % self.n, False)

    def blockers(self, r):
        k, peer, sends = self._peer(r)
        if k == 0:
            return []
        if sends:
            return [peer] if self.sent[r][k] - self.recvd[peer][k] >= self.nslots else []
        return [peer] if self.recvd[r][k] >= self.sent[peer][k] else []

    def do_step(self, r):
        k, peer, sends = self._peer(r)
        first = self.step[r] // self.width * self.slot_elems
        if k == 0 or sends:
            src = r if k == 0 else peer
            n = max(0, min(self.slot_elems, self.counts[r][src] - first))
            at = self.send_at[r][src] + first
            data = self.own[r][at:at + n]
            if k == 0:
                at = self.recv_at[r][r] + first
                self.out[r][at:at + n] = data
            else:
                self.slots[r][k][self.sent[r][k] % self.nslots] = data
                self.sent[r][k] += 1
        else:
            data = self.slots[peer][k][self.recvd[r][k] % self.nslots]
            self.recvd[r][k] += 1
            at = self.recv_at[r][peer] + first
            self.out[r][at:at + len(data)] = data
        self.step[r] += 1
