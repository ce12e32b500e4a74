"""A pure, deterministic model of N ranks' daemons running all-reduces (ring or one-shot).

The model runs the daemon's scheduler (``schedule()`` in ``pydfccl/kernels/daemon.py``, one
block per rank) with the same policy functions (:mod:`pydfccl.sched.policies`), so that a
schedule that deadlocks, livelocks or completes here does so on the GPU too, up to timing. It
is for tests: Hypothesis explores invocation orders, syncs, priorities, sizes and
interleavings, thousands of small schedules a second, and a failing one prints as JSON that
``python -m pydfccl demo --schedule FILE`` replays.

Time is in ticks. In each tick every rank takes one turn, in round-robin order or in an order
shuffled by a seed: a relaunch of its daemon if one is due, one host event, then one daemon
action (one check of a step's conditions, or one poll of an empty queue). A step waits until
all its conditions hold, then does everything at once, so a preempted collective leaves no
partial state and its context is the step index. Stretches where every daemon only spins on
a step that cannot become ready (or polls an empty queue) are skipped in one go, which is
what makes GPU-sized spin budgets cheap.

What the host does, as ``pydfccl.host.communicator`` does it:

- ``submit`` appends to the daemon's queue and launches the daemon if it is not running.
- ``sync`` (a device-wide synchronize) returns once the daemon is not running: it quit, or
  never started. A policy that never quits (``nccl``) therefore never lets a sync return
  once its daemon runs; ``launch_per_call`` quits whenever its queue is empty, as NCCL's
  per-collective kernels end.
- ``wait_all`` waits until every collective the rank submitted has completed there, and
  ``wait`` (with ``coll``) until that one has: a host that waits for a result, which is
  how ``pydfccl.torch`` waits, on CUDA tensors too.
- A daemon that quits with work outstanding is relaunched at once if that launch made
  progress, else ``relaunch_ticks`` later or at the rank's next submission.

And what pydfccl does *not* do, so that tests can show why: ``stream_wait`` (with
``coll``) makes the rank's *stream* wait on the GPU for ``coll`` while the host goes on
(``cuStreamWaitValue``, what CUDA stream ordering of a collective would be). Work behind
it on the stream waits too: a later ``submit`` enters the daemon's queue only once the
stream has passed every earlier ``stream_wait`` (the stream gate: a run starts when its
stream has made its inputs), and a ``sync`` waits for the stream as well as the daemon.
While a host sits in such a ``sync``, the rank's daemon cannot be launched: a device-wide
wait holds up the process's launches (seen on an H200 under MPS; CUDA documents that
ordering made with stream waits is invisible to its scheduler). No daemon quit can end a
stream wait, so schedules that complete with ``wait`` can deadlock with ``stream_wait``
(``tests/test_model.py``).

Each slot carries at most ``slot_elems`` elements; a collective of ``count`` elements needs
``ceil(count / (nranks * slot_elems))`` loops of ``2 * nranks - 1`` steps in the ring. A
collective of at most ``one_shot_elems`` elements runs one-shot, as the daemon runs a small
all_reduce (``kernels/plans.py``): a ``sendAll`` step that needs a free slot in every
peer's lane and writes its input there, then a ``recvReduceCopyAll`` that waits for every
peer's input and sums all of them in rank order. ``run_schedule`` takes ``one_shot_elems``
(default 0: the ring always); ``replay.predict`` passes the engine's limit.
"""

from __future__ import annotations

import bisect
import json
import random
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .policies import NEVER, Policy, get_policy

__all__ = [
    "COMPLETED",
    "DEADLOCK",
    "LIVELOCK",
    "Collective",
    "Event",
    "submit",
    "wait",
    "stream_wait",
    "SYNC",
    "WAIT_ALL",
    "Schedule",
    "Result",
    "ring_steps",
    "run_schedule",
    "find_wait_cycle",
]

COMPLETED = "completed"
DEADLOCK = "deadlock"
LIVELOCK = "livelock"

_OPS = ("submit", "sync", "wait_all", "wait", "stream_wait")
_WITH_COLL = ("submit", "wait", "stream_wait")


@dataclass(frozen=True)
class Collective:
    """An all-reduce among all ranks: ``count`` elements, larger ``priority`` runs first;
    one-shot when ``count`` is at most ``run_schedule``'s ``one_shot_elems``, else the ring."""

    count: int = 1
    priority: int = 0


@dataclass(frozen=True)
class Event:
    """One host event of a rank's program: ``submit``, ``wait`` or ``stream_wait`` (with
    ``coll``), ``sync`` or ``wait_all``."""

    op: str
    coll: Optional[int] = None

    def to_dict(self) -> dict:
        return {"op": self.op, "coll": self.coll} if self.op in _WITH_COLL else {"op": self.op}


def submit(coll: int) -> Event:
    return Event("submit", coll)


def wait(coll: int) -> Event:
    return Event("wait", coll)


def stream_wait(coll: int) -> Event:
    return Event("stream_wait", coll)


SYNC = Event("sync")
WAIT_ALL = Event("wait_all")


@dataclass
class Schedule:
    """What each rank's host does, in order; every rank submits every collective once.

    JSON (``to_json``/``from_json``, replayed by ``python -m pydfccl demo --schedule FILE``)::

        {"nranks": 2,
         "collectives": {"0": {"count": 1, "priority": 0}, "1": {"count": 4, "priority": 1}},
         "ranks": [[{"op": "submit", "coll": 0}, {"op": "sync"}, {"op": "submit", "coll": 1}],
                   [{"op": "submit", "coll": 1}, {"op": "wait_all"}, {"op": "submit", "coll": 0}]]}
    """

    nranks: int
    collectives: Dict[int, Collective]
    ranks: List[List[Event]]

    def __post_init__(self):
        if self.nranks < 2:
            raise ValueError(f"a ring needs at least 2 ranks, got nranks={self.nranks}")
        if len(self.ranks) != self.nranks:
            raise ValueError(f"nranks={self.nranks} but {len(self.ranks)} rank programs")
        for cid, coll in self.collectives.items():
            if coll.count < 1:
                raise ValueError(f"collective {cid}: count must be >= 1, got {coll.count}")
        for r, program in enumerate(self.ranks):
            submitted = []
            for ev in program:
                if ev.op not in _OPS:
                    raise ValueError(f"rank {r}: unknown op {ev.op!r}; known: {list(_OPS)}")
                if ev.op == "submit":
                    if ev.coll not in self.collectives:
                        raise ValueError(f"rank {r}: submits unknown collective {ev.coll!r}")
                    submitted.append(ev.coll)
                elif ev.op in _WITH_COLL and ev.coll not in submitted:
                    raise ValueError(f"rank {r}: {ev.op} of collective {ev.coll!r} before "
                                     "it submits it")
            if sorted(submitted) != sorted(self.collectives):
                raise ValueError(f"rank {r} must submit every collective exactly once; "
                                 f"it submits {submitted}")

    @classmethod
    def from_orders(cls, orders: Sequence[Sequence[Union[int, str]]],
                    counts: Union[int, Mapping[int, int]] = 1,
                    priorities: Optional[Mapping[int, int]] = None) -> "Schedule":
        """Build a schedule from per-rank lists such as ``[0, "sync", 1]``."""
        events = [[Event(x) if isinstance(x, str) else submit(x) for x in order]
                  for order in orders]
        ids = sorted({ev.coll for program in events for ev in program if ev.op == "submit"})
        priorities = priorities or {}
        colls = {c: Collective(counts if isinstance(counts, int) else counts[c],
                               priorities.get(c, 0)) for c in ids}
        return cls(len(orders), colls, events)

    def orders(self) -> List[List[int]]:
        """Each rank's submission order (collective ids)."""
        return [[ev.coll for ev in program if ev.op == "submit"] for program in self.ranks]

    def to_dict(self) -> dict:
        return {"nranks": self.nranks,
                "collectives": {str(c): {"count": k.count, "priority": k.priority}
                                for c, k in sorted(self.collectives.items())},
                "ranks": [[ev.to_dict() for ev in program] for program in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        colls = {int(c): Collective(int(v["count"]), int(v.get("priority", 0)))
                 for c, v in data["collectives"].items()}
        ranks = [[Event(e["op"], e.get("coll")) for e in program] for program in data["ranks"]]
        return cls(int(data["nranks"]), colls, ranks)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        return cls.from_dict(json.loads(text))


@dataclass
class Result:
    """What a schedule did.

    ``values[c][r]`` is rank r's output of collective c (None if it did not complete there);
    ``expected[c]`` the element-wise sum of the contributions. ``cycle`` (deadlocks) lists
    ``(rank, collective, waits_on_rank)``; ``waits`` maps each rank whose collectives wait
    to ``(collective, waits_on_rank)`` pairs; ``blocked`` maps each host that did not finish
    its program to the op it is stuck at (a ``sync`` there with no cycle: the daemon never
    quits).
    """

    outcome: str
    ticks: int
    preemptions: int
    quits: int
    relaunches: int
    completion_order: List[List[int]]
    values: Dict[int, List[Optional[List[int]]]]
    expected: Dict[int, List[int]]
    cycle: Optional[List[Tuple[int, int, int]]] = None
    waits: Dict[int, List[Tuple[int, int]]] = field(default_factory=dict)
    blocked: Dict[int, str] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        """Every output that exists equals the sum of the contributions."""
        return all(v is None or v == self.expected[c]
                   for c, per_rank in self.values.items() for v in per_rank)

    def summary(self) -> str:
        text = (f"{self.outcome} after {self.ticks} ticks: {self.preemptions} preemptions, "
                f"{self.quits} quits, {self.relaunches} relaunches")
        if self.cycle:
            text += "; cycle " + ", ".join(f"rank {r} in {c} waits on rank {w}"
                                           for r, c, w in self.cycle)
        return text


def ring_steps(nranks: int) -> List[Tuple[str, bool, bool]]:
    """The steps of one ring all-reduce loop as ``(name, receives, sends)``."""
    middle = nranks - 2
    return ([("send", False, True)] + [("recvReduceSend", True, True)] * middle
            + [("recvReduceCopySend", True, True)] + [("recvCopySend", True, True)] * middle
            + [("recv", True, False)])


def find_wait_cycle(edges: Mapping[int, Union[int, Sequence[int]]]) -> Optional[List[int]]:
    """A cycle of the wait-for graph, or None.

    ``edges`` maps a node to the node (or nodes) it waits on. The cycle comes back as
    ``[a, b, ..., z]``: a waits on b, ..., z waits on a, starting at its smallest node, the
    same answer for the same graph (the host watchdog reports it as is).
    """
    succ = {n: (list(v) if hasattr(v, "__iter__") else [v]) for n, v in edges.items()}
    state: Dict[int, int] = {}  # 1: on the current path, 2: explored
    for root in sorted(succ):
        if root in state:
            continue
        path, where = [root], {root: 0}
        stack = [iter(succ[root])]
        state[root] = 1
        while stack:
            for nxt in stack[-1]:
                seen = state.get(nxt)
                if seen == 1:
                    cycle = path[where[nxt]:]
                    low = cycle.index(min(cycle))
                    return cycle[low:] + cycle[:low]
                if seen is None:
                    state[nxt] = 1
                    where[nxt] = len(path)
                    path.append(nxt)
                    stack.append(iter(succ.get(nxt, ())))
                    break
            else:
                stack.pop()
                done = path.pop()
                del where[done]
                state[done] = 2
    return None


# --- the simulation ------------------------------------------------------------------------

_SPIN, _IDLE = "spin", "idle"  # what a daemon asks for in its next turn
_PREEMPTED = -1                # sent back into the daemon instead of a spin count
_IDLE_SCAN = 1 << 16           # empty polls looked ahead in one jump


class _Coll:
    """One all-reduce's state on all ranks: its steps, slot counters and data. A kind says
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


class _RingColl(_Coll):
    """The ring: connectors rank r -> r+1; a step is ring_step() and chunk_span() of
    pydfccl/kernels/ring.py."""

    __slots__ = ("slot_elems", "width")

    def __init__(self, cid, count, nranks, nslots, slot_elems, own):
        super().__init__(cid, count, nranks, nslots, own)
        self.slot_elems = slot_elems
        self.width = 2 * nranks - 1
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


class _OneShotColl(_Coll):
    """A one-shot all-reduce: every rank writes its input into a lane of each peer's slots
    (``sendAll``), then sums every rank's input in rank order (``recvReduceCopyAll``). Lane
    (q -> r) has its own ring buffer and counters, as a lane of the daemon's connector has
    its own tail and head words."""

    __slots__ = ()

    def __init__(self, cid, count, nranks, nslots, own):
        super().__init__(cid, count, nranks, nslots, own)
        self.nsteps = 2
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


class _Task:
    """A collective as one rank's daemon sees it (the kernel's saved context)."""

    __slots__ = ("coll", "seq", "key", "try_count")

    def __init__(self, coll, seq, key):
        self.coll, self.seq, self.key, self.try_count = coll, seq, key, 0


def _task_key(task):
    return task.key


class _Rank:
    __slots__ = ("r", "program", "pc", "start", "pending", "active", "outstanding", "seq",
                 "daemon", "req", "task", "threshold", "spins", "idle", "resume",
                 "relaunch_at", "launches", "steps", "launch_steps", "order", "stream")

    def __init__(self, r, program, start):
        self.r, self.program, self.pc, self.start = r, program, 0, start
        self.stream = []        # ("wait", coll) and ("submit", coll) items, in stream order
        self.pending, self.active, self.outstanding, self.seq = [], [], 0, 0
        self.daemon = self.req = self.task = self.resume = self.relaunch_at = None
        self.threshold = self.spins = self.idle = self.launches = 0
        self.steps = self.launch_steps = 0
        self.order = []


class _Stop(Exception):
    def __init__(self, outcome):
        self.outcome = outcome


class _Model:
    def __init__(self, schedule, policy, params, nslots, slot_elems, one_shot_elems,
                 relaunch_ticks, seed, start_ticks, max_quiet_ticks, values):
        n = schedule.nranks
        self.n = n
        self.p = tuple(int(x) for x in params)
        (self.threshold_on_load, self.threshold_after_wait, self.tries_per_pass,
         self.order_key, self.should_quit) = policy.functions
        self.quits_ever = _quits_ever(self.should_quit, self.p)
        self.relaunch_ticks = relaunch_ticks
        self.rng = None if seed is None else random.Random(seed)
        starts = list(start_ticks) if start_ticks is not None else [0] * n
        self.ranks = [_Rank(r, schedule.ranks[r], starts[r]) for r in range(n)]
        self.priority = {c: k.priority for c, k in schedule.collectives.items()}
        self.index = {c: i for i, c in enumerate(sorted(schedule.collectives))}  # as prepared
        self.colls = {}
        self.expected = {}
        for cid, k in sorted(schedule.collectives.items()):
            own = values[cid] if values is not None else \
                [[(r + 1) * (e + 1) + cid for e in range(k.count)] for r in range(n)]
            if k.count <= one_shot_elems:
                self.colls[cid] = _OneShotColl(cid, k.count, n, nslots, own)
            else:
                self.colls[cid] = _RingColl(cid, k.count, n, nslots, slot_elems, own)
            self.expected[cid] = [sum(col) for col in zip(*own)]
        if max_quiet_ticks is None:
            longest = _longest_pass(self.threshold_on_load, self.tries_per_pass, self.p,
                                    len(schedule.collectives)) if self.quits_ever else 0
            max_quiet_ticks = _default_quiet_ticks(self.should_quit, self.p, n,
                                                   self.quits_ever, longest)
        self.max_quiet = max_quiet_ticks
        self.t = 0
        self.changed = False
        self.last_progress = 0
        self.epoch = 0
        self.checked_epoch = -1
        self.preemptions = self.quits = 0
        self.hosts_left = sum(1 for rk in self.ranks if rk.program)
        self.outstanding = 0

    # -- bookkeeping ----------------------------------------------------------------------
    def _progress(self):
        self.changed = True
        self.last_progress = self.t
        self.epoch += 1

    def _launch(self, rk):
        rk.daemon = self._daemon(rk)
        rk.req = rk.resume = rk.relaunch_at = None
        rk.launches += 1
        rk.launch_steps = rk.steps
        self.changed = True

    def _exit(self, rk):
        """The daemon quit. A blocked device sync returns; the host relaunches the daemon
        for outstanding work: at once if this launch made progress, else after a pause
        (or at the next submission), as the communicator's launch loop does."""
        rk.daemon = rk.req = None
        self.quits += 1
        self.changed = True
        if self._at(rk, "sync") and not rk.stream:
            self._host_advance(rk)
        if rk.outstanding:
            stuck = rk.steps == rk.launch_steps
            rk.relaunch_at = self.t + (self.relaunch_ticks if stuck else 1)

    def _at(self, rk, op):
        """The rank's host has begun and its next event is ``op``."""
        return rk.pc < len(rk.program) and rk.program[rk.pc].op == op and self.t >= rk.start

    def _launch_blocked(self, rk):
        """A host in a device sync behind its stream's wait holds up the rank's launches."""
        return bool(rk.stream) and self._at(rk, "sync")

    def _submit(self, rk, cid):
        coll = self.colls[cid]
        rk.seq += 1
        key = self.order_key(self.p, self.priority[cid], rk.seq, self.index[cid])
        rk.pending.append(_Task(coll, rk.seq, key))
        rk.outstanding += 1
        self.outstanding += 1
        self.changed = True
        if rk.daemon is None:
            if self._launch_blocked(rk):
                rk.relaunch_at = self.t         # launched once the sync lets go
            else:
                self._launch(rk)

    def _advance_stream(self, rk):
        """The stream passes the waits whose collective has completed on this rank, and
        submits what follows them."""
        while rk.stream:
            what, cid = rk.stream[0]
            if what == "wait" and not self.colls[cid].done[rk.r]:
                return
            rk.stream.pop(0)
            self.changed = True
            if what == "submit":
                self._submit(rk, cid)

    def _host_advance(self, rk):
        rk.pc += 1
        if rk.pc == len(rk.program):
            self.hosts_left -= 1
        self._progress()

    # -- the daemon: schedule() of pydfccl/kernels/daemon.py, one block per rank ----------
    def _daemon(self, rk):
        p, r, act = self.p, rk.r, rk.active
        act.sort(key=_task_key)        # start(): the active tasks, in order
        rk.idle = 0
        pos, cur, tries_left, threshold = 0, None, 0, 0
        while True:
            if cur is None:
                if pos == 0:                                  # a new pass over the tasks
                    if rk.pending:                            # absorb new submissions;
                        rk.idle = 0                           # new work is activity
                    for task in rk.pending:
                        bisect.insort(act, task, key=_task_key)
                    rk.pending.clear()
                    if not act:
                        # Empty polls run in _turn, one a tick (idle += 1; exit when
                        # should_quit), until a submission arrives (False) or it quits.
                        if (yield _IDLE):
                            return
                        continue
                if pos >= len(act):                           # the pass is over
                    if self.should_quit(p, rk.idle):
                        return
                    pos = 0
                    continue
                is_head = 1 if pos == 0 else 0
                if tries_left <= 0:
                    tries_left = max(1, self.tries_per_pass(p, is_head))
                cur = act[pos]
                cur.try_count += 1
                threshold = self.threshold_on_load(p, is_head, cur.try_count)
            coll = cur.coll
            if coll.step[r] == coll.nsteps:                   # done: retire it
                del act[pos]
                tries_left = 0
                self._retire(rk, cur)
                cur = None
                continue
            rk.task, rk.threshold, rk.spins = cur, threshold, 0
            spins = yield _SPIN                               # _turn spins, once a tick
            if spins == _PREEMPTED:
                cur = None
                rk.idle += threshold
                tries_left -= 1
                if tries_left <= 0:
                    pos += 1
                continue
            threshold = self.threshold_after_wait(p, threshold, spins)
            rk.idle = 0

    def _retire(self, rk, task):
        rk.outstanding -= 1
        self.outstanding -= 1
        task.coll.done[rk.r] = True
        rk.order.append(task.coll.cid)
        self._progress()

    # -- one turn of one rank -------------------------------------------------------------
    def _host(self, rk):
        ev = rk.program[rk.pc]
        if ev.op == "submit":
            self._host_advance(rk)
            if rk.stream:                                 # gated behind the stream's waits
                rk.stream.append(("submit", ev.coll))
            else:
                self._submit(rk, ev.coll)
        elif ev.op == "stream_wait":
            rk.stream.append(("wait", ev.coll))
            self._host_advance(rk)
        elif self._host_wait(rk) == 0:                    # sync, wait_all, wait
            self._host_advance(rk)

    def _turn(self, rk):
        self._advance_stream(rk)
        if (rk.daemon is None and rk.relaunch_at is not None and self.t >= rk.relaunch_at
                and not self._launch_blocked(rk)):
            self._launch(rk)
        if rk.pc < len(rk.program) and self.t >= rk.start:
            self._host(rk)
        if rk.daemon is None:
            return
        while True:
            if rk.req is None:
                try:
                    rk.req = rk.daemon.send(rk.resume)
                except StopIteration:
                    self._exit(rk)
                    return
                self.changed = True
            if rk.req is _SPIN:
                break
            if rk.pending:                                # a submission ends the polling
                rk.req, rk.resume = None, False
                continue
            rk.idle += 1                                  # one empty poll
            if not self.should_quit(self.p, rk.idle):
                return
            rk.req, rk.resume = None, True
        coll, r = rk.task.coll, rk.r
        if coll.ready(r):
            coll.do_step(r)
            rk.steps += 1
            rk.resume, rk.req = rk.spins, None
            self._progress()
        else:
            rk.spins += 1
            if rk.spins >= rk.threshold:
                self.preemptions += 1
                rk.resume, rk.req = _PREEMPTED, None
                self.changed = True

    # -- the clock ------------------------------------------------------------------------
    def run(self):
        order = list(range(self.n))
        try:
            while True:
                self.changed = False
                if self.rng is not None:
                    self.rng.shuffle(order)
                for r in order:
                    self._turn(self.ranks[r])
                self.t += 1
                if self.hosts_left == 0 and self.outstanding == 0:
                    raise _Stop(COMPLETED)
                if not self.changed:
                    self._skip_ahead()
                elif self.epoch != self.checked_epoch and \
                        self.t - self.last_progress >= 4 * self.n:
                    self.checked_epoch = self.epoch
                    if self._frozen():
                        raise _Stop(DEADLOCK)
                if self.t - self.last_progress > self.max_quiet and \
                        all(self.t >= rk.start for rk in self.ranks if rk.pc < len(rk.program)):
                    raise _Stop(LIVELOCK)
        except _Stop as stop:
            return self._result(stop.outcome)

    def _skip_ahead(self):
        """Nothing changed this tick: jump to the next tick where something can.

        Spinning daemons keep failing the same check until their budget runs out; polling
        daemons keep counting empty polls until should_quit says yes (asked poll by poll, at
        most ``_IDLE_SCAN`` per jump, since a policy need not be monotonic).
        """
        ticks = NEVER
        idlers = []
        for rk in self.ranks:
            if rk.daemon is not None:
                if rk.req is _IDLE:
                    idlers.append(rk)
                elif rk.threshold < NEVER:
                    ticks = min(ticks, rk.threshold - rk.spins - 1)
            elif rk.relaunch_at is not None and not self._launch_blocked(rk):
                ticks = min(ticks, rk.relaunch_at - self.t)
            if rk.pc < len(rk.program):
                ticks = min(ticks, self._host_wait(rk))
        if idlers and self.quits_ever:
            ticks = min(ticks, _IDLE_SCAN)
            for rk in idlers:
                for i in range(1, ticks + 1):
                    if self.should_quit(self.p, rk.idle + i):
                        ticks = i - 1
                        break
        if ticks >= NEVER:
            raise _Stop(DEADLOCK)  # every daemon spins or polls forever: nothing can change
        if ticks > 0:
            for rk in idlers:
                rk.idle += ticks
            for rk in self.ranks:
                if rk.daemon is not None and rk.req is _SPIN:
                    rk.spins += ticks
            self.t += ticks

    def _host_wait(self, rk):
        """Ticks until this host can take its next event, as far as it alone decides."""
        if self.t < rk.start:
            return rk.start - self.t
        ev = rk.program[rk.pc]
        if ev.op in ("submit", "stream_wait") or \
                (ev.op == "sync" and rk.daemon is None and not rk.stream) or \
                (ev.op == "wait_all" and rk.outstanding == 0 and not rk.stream) or \
                (ev.op == "wait" and self.colls[ev.coll].done[rk.r]):
            return 0
        return NEVER

    def _frozen(self):
        """True when no step anywhere can run and no host can move: a deadlock whatever the
        daemons do (they can only preempt, quit and relaunch from here on). A host in a
        sync behind its stream's wait moves only once a step completes that collective."""
        for rk in self.ranks:
            if rk.pc < len(rk.program):
                op = rk.program[rk.pc].op
                waiting = (op in ("wait_all", "wait") and self._host_wait(rk) != 0) or \
                    (op == "sync" and rk.stream)      # behind a stream wait: steps must come
                if self.t < rk.start or not waiting:
                    return False
            if rk.daemon is None and self._launch_blocked(rk):
                continue                  # no daemon can run this rank's steps
            for task in rk.pending + rk.active:
                coll = task.coll
                if coll.step[rk.r] == coll.nsteps or coll.ready(rk.r):
                    return False
        return True

    # -- the report -----------------------------------------------------------------------
    def _waits(self, outcome):
        waits = {}
        for rk in self.ranks:
            if outcome == DEADLOCK and rk.req is _SPIN and rk.threshold >= NEVER:
                tasks = [rk.task]       # a daemon that spins forever waits on this one only
            else:
                tasks = sorted(rk.pending + rk.active, key=_task_key)
            pairs = [(t.coll.cid, w) for t in tasks for w in t.coll.blockers(rk.r)]
            if pairs:
                waits[rk.r] = pairs
        return waits

    def _result(self, outcome):
        waits = self._waits(outcome) if outcome != COMPLETED else {}
        cycle = None
        if outcome == DEADLOCK:
            ring = find_wait_cycle({r: [w for _, w in pairs] for r, pairs in waits.items()})
            if ring:
                cycle = []
                for i, r in enumerate(ring):
                    nxt = ring[(i + 1) % len(ring)]
                    cycle.append((r, next(c for c, w in waits[r] if w == nxt), nxt))
        blocked = {rk.r: rk.program[rk.pc].op for rk in self.ranks
                   if rk.pc < len(rk.program) and outcome != COMPLETED}
        values = {cid: [coll.out[r] if coll.done[r] else None for r in range(self.n)]
                  for cid, coll in self.colls.items()}
        return Result(outcome, self.t, self.preemptions, self.quits,
                      sum(max(rk.launches - 1, 0) for rk in self.ranks),
                      [rk.order for rk in self.ranks], values, self.expected, cycle, waits,
                      blocked)


@lru_cache(maxsize=256)
def _quits_ever(should_quit, params):
    """Whether ``should_quit`` ever says yes (checked on 1..4096 and every power of two)."""
    probes = list(range(1, 4097)) + [1 << k for k in range(13, 63)]
    return any(should_quit(params, k) for k in probes)


def _longest_pass(threshold_on_load, tries_per_pass, params, ncolls):
    """Ticks a daemon can spin through one pass over ``ncolls`` tasks without progress: it
    asks ``should_quit`` only between passes, and a long head budget (dfccl's HEAD_BASE)
    makes a pass outlast QUIT_AFTER many times over (HEAD_BASE 500 and NUM_TRY 5 spin 7,500
    ticks on the head alone)."""
    def spins(is_head):
        longest = max(threshold_on_load(params, is_head, t) for t in range(1, 65))
        return max(1, tries_per_pass(params, is_head)) * longest
    return spins(1) + (ncolls - 1) * spins(0)


def _default_quiet_ticks(should_quit, params, nranks, quits_ever, longest_pass):
    """Ticks without progress after which a schedule counts as livelocked.

    A daemon without progress quits after Q spins (the first power of two where
    ``should_quit`` says yes) once its pass is over (``longest_pass`` at most); other
    daemons may quit and relaunch meanwhile, so allow 64 * nranks * max(Q, longest_pass).
    A policy that never quits gets a million ticks.
    """
    if not quits_ever:
        return 1_000_000
    k = 1
    while not should_quit(params, k) and k < 1 << 62:
        k *= 2
    return 64 * nranks * max(k, longest_pass) + 10_000


def run_schedule(schedule: Schedule, policy: Union[str, Policy] = "dfccl", params=None, *,
                 nslots: int = 4, slot_elems: int = 1, one_shot_elems: int = 0,
                 relaunch_ticks: int = 1,
                 seed: Optional[int] = None, start_ticks: Optional[Sequence[int]] = None,
                 max_quiet_ticks: Optional[int] = None,
                 values: Optional[Mapping[int, Sequence[Sequence[int]]]] = None) -> Result:
    """Run ``schedule`` under ``policy`` and report completion, deadlock or livelock.

    ``params`` defaults to ``policy.param_array(model=True)`` (budgets in ticks).
    Collectives of at most ``one_shot_elems`` elements run one-shot (module docstring).
    ``relaunch_ticks`` is the host's pause before relaunching a daemon that quit without
    progress. ``seed`` shuffles the ranks' order within each tick (None: round-robin);
    ``start_ticks`` delays each rank's host. ``values[c][r]`` is rank r's contribution to
    collective c (default: small distinct integers). Deterministic: the same arguments give
    the same Result.
    """
    policy = get_policy(policy)
    if params is None:
        params = policy.param_array(model=True)
    if nslots < 2:
        # every rank would hold a full outgoing slot and need a free one to consume its input
        raise ValueError(f"a ring with atomic recv+send steps needs nslots >= 2, got {nslots}")
    if slot_elems < 1 or relaunch_ticks < 1:
        raise ValueError("slot_elems and relaunch_ticks must be >= 1")
    if start_ticks is not None and len(start_ticks) != schedule.nranks:
        raise ValueError(f"start_ticks needs {schedule.nranks} entries")
    model = _Model(schedule, policy, params, nslots, slot_elems, one_shot_elems,
                   relaunch_ticks, seed, start_ticks, max_quiet_ticks, values)
    return model.run()
