"""The slot leader: which registered collective runs in which of the daemon's slots, when
a communicator has more registrations than slots (``WorldConfig.max_colls``).

A slot is a table index of the daemons with everything keyed by it: its SQ and CQ
entries, its saved contexts, its completion counters and its connector set. Beyond the
slots, collectives share them: a collective is bound to a slot (an ``all_to_all`` to
``nranks - 1`` consecutive slots, one connector set each) for some of its runs, and the
slot is bound to another one once every rank has completed them.

Two dangers, and how the leader (rank 0's host) removes both:

* ranks that submit in different orders could bind different collectives to one slot
  (their data would mix), and
* ranks could each take slots the others need (a new deadlock: rank 0 binds A to the last
  free slot and waits for rank 1's A while rank 1 bound B there).

So one leader decides every binding, in one order, through the control rows that every
rank of the host shares: a rank asks for each run (its request ring), and the leader
grants ``m`` runs of a collective only when every rank of it has asked for ``m`` more:
granted runs are then submitted by all of its ranks and complete under the daemons'
preemption, which frees their slot. Grants go out strictly in the order collectives
became ready, so a collective that waits for a slot is never overtaken for ever: while it
waits no new grants are made, the runs in flight complete and the slots it needs free up.

A binding replaces another only when every rank has completed every run granted in the
slot (``slot_done``), so the slot's connectors are quiet on every side; each rank then
resets its own part of the slot (contexts, completion counters, connector counters) and
says so (``slot_reset``), and the ranks of the new binding submit its runs only once all
of them have (``host/shared_slots.py``). The leader keeps host memory per registered
collective; the shared memory is fixed.
"""

from __future__ import annotations

import collections

import numpy as np

from ..protocol import layout as L
from .registration import check_published, member, published_signature

__all__ = ["SlotLeader", "COMPANION", "UNBOUND"]

UNBOUND = -1     # ``bind_coll`` of a slot bound to nothing
COMPANION = -2   # ``bind_coll`` of a slot whose connector set an all_to_all before it uses


class SlotLeader:
    """Rank 0's bindings of the collectives ``members`` ({coll_id: (slots it needs, ranks
    that run it)}) to the ``nslots`` slots of the world whose control rows are ``ctl``.
    Collectives prepared after ``start()`` join ``members`` as the ranks publish them (the
    ``late`` rings); their runs are granted once every rank of them has published the same
    signature, and ``fail(error)`` is called when they differ. Slots below ``first`` are
    other collectives' own (``start(share_slots="overflow")``): never bound here."""

    def __init__(self, ctl, nranks: int, nslots: int, members: dict, fail=None,
                 first: int = 0):
        self.ctl, self.nranks, self.nslots, self.first = ctl, nranks, nslots, first
        self.members = dict(members)
        self.fail = fail
        self.late: dict[int, dict] = {}      # coll_id -> {rank: signature} published late
        self._row = ctl[0:1]
        self.want: dict[int, list] = {}           # coll_id -> runs asked, not granted, per rank
        self.ready: collections.deque = collections.deque()   # collectives ready, in order
        self._queued: set = set()
        self.bound: dict[int, int] = {}           # coll_id -> its first slot
        self.slot_coll = [UNBOUND] * nslots       # the collective at a first slot
        self.owner = [-1] * nslots                # the first slot of a slot's binding
        self.granted = np.zeros((nranks, nslots), np.int64)   # runs granted, ever
        self.used_at = [0] * nslots
        self._clock = 0

    def busy(self) -> bool:
        """Whether a rank has asked for runs the leader has not read, or runs wait."""
        ctl = self.ctl
        return (bool(self.ready) or bool((ctl["req_head"] != ctl["req_seen"]).any())
                or bool((ctl["late_head"] != ctl["late_seen"]).any()))

    def poll(self) -> bool:
        """Read the ranks' new requests and grant what can be granted; True if any."""
        self._read_requests()
        return self._grant() if self.ready else False

    def _read_requests(self) -> None:
        """Late registrations, then requests: a request's registration was published
        before it, so reading the request heads first finds it."""
        ctl = self.ctl
        heads = ctl["req_head"].copy()
        self._read_late()
        for r in range(self.nranks):
            seen, head = int(ctl["req_seen"][r]), int(heads[r])
            if seen == head:
                continue
            ring = ctl["req"][r]
            for k in range(seen, head):
                self._asked(int(ring[k % L.REQUEST_CAP]), r)
            ctl["req_seen"][r] = head      # the rank may reuse those entries now

    def _read_late(self) -> None:
        ctl = self.ctl
        for r in range(self.nranks):
            seen, head = int(ctl["late_seen"][r]), int(ctl["late_head"][r])
            for k in range(seen, head):
                entry = ctl["late"][r][k % L.LATE_CAP]
                self._published(int(entry["coll_id"]), r, published_signature(entry))
            if seen != head:
                ctl["late_seen"][r] = head

    def _published(self, coll_id: int, rank: int, sig: dict) -> None:
        """Rank ``rank`` prepared ``coll_id`` after start() with signature ``sig``."""
        sigs = self.late.setdefault(coll_id, {})
        sigs[rank] = sig
        if coll_id not in self.members:
            self.members[coll_id] = member(sig["kind"], sig["root"], rank, self.nranks)
        try:
            check_published(coll_id, sigs)
        except ValueError as exc:
            if self.fail is not None:
                self.fail(exc)
            return
        if (coll_id in self.want and coll_id not in self._queued
                and self._runs_ready(coll_id)):
            self._queued.add(coll_id)
            self.ready.append(coll_id)

    def _asked(self, coll_id: int, rank: int) -> None:
        want = self.want.get(coll_id)
        if want is None:
            want = self.want[coll_id] = [0] * self.nranks
        want[rank] += 1
        if (coll_id not in self._queued and coll_id in self.members
                and self._runs_ready(coll_id)):
            self._queued.add(coll_id)
            self.ready.append(coll_id)

    def _runs_ready(self, coll_id: int) -> int:
        """Runs of ``coll_id`` every rank of it has asked for and not been granted (none
        while a rank of a late registration has yet to publish it)."""
        want = self.want[coll_id]
        ranks = self.members[coll_id][1]
        late = self.late.get(coll_id)
        if late is not None and len(late) < len(ranks):
            return 0
        return min(want[r] for r in ranks)

    def _quiet(self, first: int, done: np.ndarray) -> bool:
        """Every rank completed every run granted in the binding at ``first``."""
        return bool((done[:, first] == self.granted[:, first]).all())

    def _usable(self, slot: int, done: np.ndarray) -> bool:
        owner = self.owner[slot]
        return owner < 0 or self._quiet(owner, done)

    def _window(self, width: int, done: np.ndarray) -> int | None:
        """The first slot of ``width`` consecutive slots free or quiet: a never-bound slot
        first, else the binding used least recently."""
        slots = range(self.first, self.nslots)
        if width == 1:
            free = [s for s in slots if self.owner[s] < 0]
            if free:
                return free[0]
            quiet = [s for s in slots if self._usable(s, done)]
            return min(quiet, key=self.used_at.__getitem__) if quiet else None
        for first in range(self.first, self.nslots - width + 1):
            if all(self._usable(s, done) for s in range(first, first + width)):
                return first
        return None

    def _evict(self, first: int) -> None:
        """Forget the binding at ``first`` (all its slots)."""
        self.bound.pop(self.slot_coll[first], None)
        self.slot_coll[first] = UNBOUND
        for s in range(self.nslots):
            if self.owner[s] == first:
                self.owner[s] = -1

    def _bind(self, first: int, width: int, coll_id: int) -> None:
        """Publish ``coll_id`` at ``first`` (and companions after it), a new epoch each:
        odd while the record is rewritten (the ranks read it as a sequence lock)."""
        row = self._row
        for s in range(first, first + width):
            if self.owner[s] >= 0:
                self._evict(self.owner[s])
        for s in reversed(range(first, first + width)):   # the first slot last: a rank
            self.owner[s] = first                          # that sees it sees the others
            row["bind_epoch"][0, s] += 1
            row["bind_coll"][0, s] = coll_id if s == first else COMPANION
            row["bind_epoch"][0, s] += 1
        self.slot_coll[first] = coll_id
        self.bound[coll_id] = first

    def _grant(self) -> bool:
        """Grant the ready collectives in order, each the runs every rank of it asked for:
        in its slot if it is bound, else in a slot bound for it; stop at the first that
        finds none (the slots free up as the runs in flight complete). Every rank submits
        the grants in this order, so their runs enter every rank's SQ in one order."""
        done = self.ctl["slot_done"][:, : self.nslots].copy()
        row = self._row
        granted = False
        head = int(row["grant_head"][0])
        room = L.GRANT_CAP - (head - int(self.ctl["grant_seen"].min()))
        while self.ready and room > 0:
            coll_id = self.ready[0]
            width, ranks = self.members[coll_id]
            first = self.bound.get(coll_id)
            if first is None:
                first = self._window(width, done)
                if first is None:
                    break
                self._bind(first, width, coll_id)
            runs = self._runs_ready(coll_id)
            want = self.want[coll_id]
            for r in ranks:
                want[r] -= runs
                self.granted[r, first] += runs
            k = head % L.GRANT_CAP
            row["grant_slot"][0, k] = first
            row["grant_epoch"][0, k] = row["bind_epoch"][0, first]
            row["grant_runs"][0, k] = runs
            head += 1
            room -= 1
            row["grant_head"][0] = head       # last: the ranks read the entry after it
            self._clock += 1
            self.used_at[first] = self._clock
            self.ready.popleft()
            self._queued.discard(coll_id)
            granted = True
        return granted
