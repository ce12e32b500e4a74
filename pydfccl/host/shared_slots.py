"""A rank's side of shared slots (``host/slots.py`` has the leader and the why).

A run of a collective without a slot of its own waits on the host, and the rank asks the
leader for it (its request ring in the control row). The poller follows the leader's
bindings: a slot bound anew (a new epoch) is quiet on every rank, so this rank resets its
part of it (the saved contexts and completion counters of every block, the connector
counters in its pool) and writes the collective's table entry, on a thread of its own
(``slot_resets``: the poller never waits on the device), and says so (``slot_reset``);
once every rank of the binding has, the poller submits the granted runs into the slot, in
the order of the leader's grants, the oldest first, so the k-th run on every rank meets
the k-th on every other. Each completion in a
slot is counted (``slot_done``): the leader binds the slot anew only when every rank has
completed every run granted in it.
"""

from __future__ import annotations

import collections

import numpy as np

from ..log import logger
from ..protocol import layout as L
from ..protocol.codes import dtype_code, kind_code, op_code
from .registration import member, members
from .slot_resets import resets
from .slots import COMPANION, UNBOUND, SlotLeader

__all__ = ["SharedSlots", "share_slots"]


def share_slots(world, rank: int, lock, catalog, submissions, per_rank: list, fail,
                first: int = 0) -> "SharedSlots":
    """Rank ``rank``'s side of the world's shared slots, those from ``first`` on, for the
    collectives registered before ``start()`` (``per_rank``, every rank's signatures) and
    any prepared after it; rank 0's also leads. ``fail(error)`` fails every rank."""
    cfg = world.config
    if world.remote:      # the leader's rings live in one host's shared memory
        raise ValueError(f"the collectives need more than WorldConfig.max_colls = "
                         f"{cfg.max_colls} slots, and shared slots need every rank on "
                         "one host: prepare at most max_colls collectives, or raise it")
    need = members(per_rank, world.nranks)
    widest = max((width for width, _ in need.values()), default=1)
    if widest > cfg.max_colls:
        raise ValueError(f"an all_to_all needs {widest} connector sets (nranks - 1), "
                         f"more than WorldConfig.max_colls = {cfg.max_colls}")
    leader = (SlotLeader(world.ctl, world.nranks, cfg.max_colls, need, fail=fail,
                         first=first) if rank == 0 else None)
    logger.info("rank %d: %d collectives share %d slots", rank, len(need),
                cfg.max_colls - first)
    return SharedSlots(world, rank, lock, catalog, submissions, need, leader, first=first)


class SharedSlots:
    """Rank ``rank``'s runs of the collectives ``members`` ({coll_id: (slots, ranks)}),
    shared among the world's ``nslots`` slots. Its runs waiting for a grant are
    ``submissions.waiting`` (which ``fail_all`` fails); ``on_submitted`` is called after
    granted runs went to the SQ. Rank 0 also polls the ``leader``. The slots from ``first``
    on are shared; those below it belong to collectives of their own."""

    def __init__(self, world, rank: int, lock, catalog, submissions, members: dict,
                 leader=None, first: int = 0):
        self.world, self.rank = world, rank
        cfg = world.config
        self.nslots, self.first = cfg.max_colls, first
        self._lock = lock
        self._catalog = catalog
        self._submissions = submissions
        self.members = members
        self.leader = leader
        ctl = world.ctl
        self._ctl = ctl
        self._row = ctl[rank: rank + 1]
        self._leader = ctl[0:1]
        self._pool = world.pools[rank]
        self._nblocks, self._conn_stride = cfg.nblocks, cfg.conn_stride
        self.waiting = submissions.waiting       # coll_id -> runs waiting for a grant
        self._backlog: collections.deque = collections.deque()   # requests not yet written
        self._late_backlog: collections.deque = collections.deque()  # registrations too
        self._asked = 0
        self._published = 0
        self.epoch = np.zeros(self.nslots, np.int64)     # the binding this rank follows
        self.coll = [UNBOUND] * self.nslots
        self._next = 0                                   # the next grant to submit
        self.on_submitted = None

    # -- the communicator's side (the lock held) --------------------------------------------

    def add(self, coll_id: int, run: tuple) -> None:
        """A run of ``coll_id``: it waits for a grant; ask the leader for it."""
        self.waiting.setdefault(coll_id, collections.deque()).append(run)
        if self._backlog or self._late_backlog or not self._request(coll_id):
            self._backlog.append(coll_id)

    def prepare_late(self, spec, signature: dict) -> None:
        """``spec`` was prepared after ``start()``: publish its ``signature`` for the
        leader, which grants its runs once every rank of it published the same one."""
        width, ranks = member(spec.kind, spec.root, self.rank, self.world.nranks)
        if width > self.nslots - self.first:
            raise ValueError(f"collective {spec.coll_id}: an all_to_all needs {width} "
                             f"connector sets (nranks - 1), more than the "
                             f"{self.nslots - self.first} shared slots of "
                             f"WorldConfig.max_colls = {self.nslots}")
        record = (0, spec.coll_id, kind_code(spec.kind), dtype_code(spec.dtype),
                  op_code(spec.op), spec.count, spec.root, int(signature["one_shot"]))
        with self._lock:
            self.members[spec.coll_id] = (width, ranks)
            if self._late_backlog or not self._publish(record):
                self._late_backlog.append(record)

    def _publish(self, record: tuple) -> bool:
        if not self._append("late", L.LATE_CAP, self._published, record):
            return False
        self._published += 1
        return True

    def _request(self, coll_id: int) -> bool:
        if not self._append("req", L.REQUEST_CAP, self._asked, coll_id):
            return False
        self._asked += 1
        return True

    def _append(self, ring: str, cap: int, k: int, entry) -> bool:
        """Write entry ``k`` of one of the rank's rings in its control row (``ring``, its
        ``_head`` and the leader's ``_seen``); False while the ring is full."""
        row = self._row
        if k - int(row[f"{ring}_seen"][0]) >= cap:
            return False
        row[ring][0, k % cap] = entry
        row[f"{ring}_head"][0] = k + 1      # last: the leader reads the entry after it
        return True

    def completed(self, slot: int) -> None:
        """A run in ``slot`` completed (the CQ's drain, the lock held)."""
        self._row["slot_done"][0, slot] += 1

    # -- the poller's side ------------------------------------------------------------------

    def needs_polling(self) -> bool:
        return (bool(self._backlog) or bool(self._late_backlog) or any(self.waiting.values())
                or int(self._leader["grant_head"][0]) != self._next   # the leader's ring
                or (self.leader is not None and self.leader.busy()))

    def poll(self) -> bool:
        """Follow the leader's bindings and submit its grants, in the order made; True if
        runs went to the SQ."""
        with self._lock:
            while self._late_backlog and self._publish(self._late_backlog[0]):
                self._late_backlog.popleft()
            while not self._late_backlog and self._backlog and self._request(self._backlog[0]):
                self._backlog.popleft()
        if self.leader is not None:
            self.leader.poll()
        lead = self._leader
        head = int(lead["grant_head"][0])     # before the bindings: those of its grants
        if self._next == head:
            return False
        n = self.nslots
        e1 = lead["bind_epoch"][0, :n].copy()
        colls = lead["bind_coll"][0, :n].copy()
        e2 = lead["bind_epoch"][0, :n].copy()
        steady = (e1 == e2) & (e1 % 2 == 0)
        for slot in np.flatnonzero(steady & (e1 != self.epoch)).tolist():
            self._rebind(slot, int(e1[slot]), int(colls[slot]))
        submitted = False
        while self._next < head:
            k = self._next % L.GRANT_CAP
            slot = int(lead["grant_slot"][0, k])
            epoch = int(lead["grant_epoch"][0, k])
            if epoch > self.epoch[slot]:
                break                     # its binding is being written: the next poll
            coll_id = self.coll[slot] if epoch == self.epoch[slot] else UNBOUND
            if coll_id >= 0:              # (a slot bound anew since: not this rank's grant)
                if not self._all_reset(slot, e1):
                    break                 # the grants keep their order on every rank
                submitted = self._submit(slot, coll_id, int(lead["grant_runs"][0, k])) \
                    or submitted
            self._next += 1
        self._row["grant_seen"][0] = self._next
        if submitted and self.on_submitted is not None:
            self.on_submitted()
        return submitted

    def _rebind(self, slot: int, epoch: int, coll_id: int) -> None:
        """The leader bound ``slot`` anew; every rank has completed its runs there. Its
        reset and table entry are device writes, which the poller hands to the resets
        thread (``slot_resets``); that thread says the slot is reset once they are made."""
        entry = None
        if coll_id in self._catalog.specs:          # this rank runs it
            spec = self._catalog.specs[coll_id]
            entry = np.array([self._catalog.table_entry(spec, slot)], L.COLL_ENTRY)
        with self._lock:
            if coll_id >= 0:
                self._catalog.by_index[slot] = coll_id     # reports name it
            self.coll[slot] = coll_id if entry is not None else (
                COMPANION if coll_id == COMPANION else UNBOUND)
            self.epoch[slot] = epoch
        resets.put(lambda: self._reset(slot, entry), lambda: self._reset_done(slot, epoch))

    def _reset_done(self, slot: int, epoch: int) -> None:
        """After the writes: the peers may send into the slot now."""
        word = self._row["slot_reset"]
        if word[0, slot] < epoch:
            word[0, slot] = epoch

    def _reset(self, slot: int, entry) -> None:
        """This rank's part of ``slot`` back to its state at start: every block's saved
        context and run counters, the completion counters, and the connector counters
        (tail and head words, every lane) of its connector set in this pool; then the
        table ``entry`` of the collective bound there, if this rank runs it."""
        nblocks, done = self._nblocks, L.RUNS_IN_FLIGHT * 8
        self._pool.zero_rows([    # (offset, pitch, width, rows); one wait for all of it
            (L.P_TASKS + slot * L.TASK_SIZE, L.MAX_COLLS * L.TASK_SIZE, L.TASK_SIZE, nblocks),
            (L.P_DONE + slot * done, done, done, 1),
            (L.HEADER_BYTES + slot * nblocks * self._conn_stride, self._conn_stride,
             L.CONN_HEADER_BYTES, nblocks)],
            write=None if entry is None else (L.P_COLLS + slot * L.COLL_SIZE, entry))

    def _all_reset(self, first: int, published: np.ndarray) -> bool:
        """Every rank of the binding at ``first`` has reset each of its slots for it (the
        epochs the leader ``published``, which this rank follows)."""
        coll_id = self.coll[first]
        width, ranks = self.members[coll_id]
        resets = self._ctl["slot_reset"]
        for slot in range(first, first + width):
            epoch = self.epoch[slot]
            if published[slot] != epoch or any(int(resets[r, slot]) < epoch for r in ranks):
                return False
        return True

    def _submit(self, slot: int, coll_id: int, runs: int) -> bool:
        """The oldest ``runs`` runs of ``coll_id`` into ``slot``."""
        with self._lock:
            waiting = self.waiting.get(coll_id)
            count = 0
            while count < runs and waiting:
                self._submissions.add(slot, *waiting.popleft())
                count += 1
            if count and self._submissions.wake is not None:
                self._submissions.wake()
        return count > 0
