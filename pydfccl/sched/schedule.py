"""The model's inputs and outputs: what each rank's host does (a :class:`Schedule` of
:class:`Event` s over :class:`Collective` s, with its JSON) and what came of it
(:class:`Result`). The simulation itself is :mod:`pydfccl.sched.simulation`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

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
]


COMPLETED = "completed"
DEADLOCK = "deadlock"
LIVELOCK = "livelock"

_OPS = ("submit", "sync", "wait_all", "wait", "stream_wait")
_WITH_COLL = ("submit", "wait", "stream_wait")


KINDS = ("all_reduce", "all_to_allv")


@dataclass(frozen=True)
class Collective:
    """A collective among all ranks, larger ``priority`` first. An all-reduce of ``count``
    elements: one-shot when ``count`` is at most ``run_schedule``'s ``one_shot_elems``,
    else the ring. An all_to_allv: ``counts[a][b]`` elements from rank a to rank b, each at
    most ``count`` (the largest block, its loops' span)."""

    count: int = 1
    priority: int = 0
    kind: str = "all_reduce"
    counts: Optional[Tuple[Tuple[int, ...], ...]] = None

    @classmethod
    def all_to_allv(cls, counts, priority: int = 0) -> "Collective":
        """An all_to_allv whose ``count`` is its largest block."""
        counts = tuple(tuple(int(c) for c in row) for row in counts)
        return cls(max(max(row) for row in counts), priority, "all_to_allv", counts)

    def check(self, cid: int, nranks: int) -> None:
        """ValueError naming what is wrong with collective ``cid`` among ``nranks`` ranks."""
        if self.kind not in KINDS:
            raise ValueError(f"collective {cid}: kind must be one of {KINDS}, not {self.kind!r}")
        if self.count < 1:
            raise ValueError(f"collective {cid}: count must be >= 1, got {self.count}")
        if (self.kind == "all_to_allv") != (self.counts is not None):
            raise ValueError(f"collective {cid}: counts= goes with kind all_to_allv, and only "
                             "with it")
        if self.counts is not None and (len(self.counts) != nranks or any(
                len(row) != nranks or not all(0 <= c <= self.count for c in row)
                for row in self.counts)):
            raise ValueError(f"collective {cid}: counts must be {nranks} rows of {nranks} "
                             f"counts in 0..{self.count}, got {self.counts}")

    def to_dict(self) -> dict:
        out = {"count": self.count, "priority": self.priority}
        if self.kind != "all_reduce":
            out.update(kind=self.kind, counts=[list(row) for row in self.counts])
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Collective":
        counts = data.get("counts")
        return cls(int(data["count"]), int(data.get("priority", 0)),
                   data.get("kind", "all_reduce"),
                   None if counts is None else tuple(tuple(int(c) for c in row)
                                                     for row in counts))


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
            coll.check(cid, self.nranks)
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
                "collectives": {str(c): k.to_dict() for c, k in sorted(self.collectives.items())},
                "ranks": [[ev.to_dict() for ev in program] for program in self.ranks]}

    @classmethod
    def from_dict(cls, data: dict) -> "Schedule":
        colls = {int(c): Collective.from_dict(v) for c, v in data["collectives"].items()}
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
    ``expected[c]`` the element-wise sum of the contributions (an all-reduce's) or each
    rank's blocks from every rank, a list per rank (an all_to_allv's; ``wanted``). ``cycle``
    (deadlocks) lists ``(rank, collective, waits_on_rank)``; ``waits`` maps each rank whose
    collectives wait to ``(collective, waits_on_rank)`` pairs; ``blocked`` maps each host
    that did not finish its program to the op it is stuck at (a ``sync`` there with no
    cycle: the daemon never quits).
    """

    outcome: str
    ticks: int
    preemptions: int
    quits: int
    relaunches: int
    completion_order: List[List[int]]
    values: Dict[int, List[Optional[List[int]]]]
    expected: Dict[int, list]
    cycle: Optional[List[Tuple[int, int, int]]] = None
    waits: Dict[int, List[Tuple[int, int]]] = field(default_factory=dict)
    blocked: Dict[int, str] = field(default_factory=dict)

    per_rank: frozenset = frozenset()    # collectives whose ranks each want their own

    def wanted(self, coll: int, rank: int) -> List[int]:
        """Rank ``rank``'s right output of collective ``coll``."""
        return self.expected[coll][rank] if coll in self.per_rank else self.expected[coll]

    @property
    def exact(self) -> bool:
        """Every output that exists is the right one."""
        return all(v is None or v == self.wanted(c, r)
                   for c, per_rank in self.values.items() for r, v in enumerate(per_rank))

    def summary(self) -> str:
        text = (f"{self.outcome} after {self.ticks} ticks: {self.preemptions} preemptions, "
                f"{self.quits} quits, {self.relaunches} relaunches")
        if self.cycle:
            text += "; cycle " + ", ".join(f"rank {r} in {c} waits on rank {w}"
                                           for r, c, w in self.cycle)
        elif self.outcome != COMPLETED:         # who is stuck, and on whom
            if self.blocked:
                text += "; hosts blocked: " + ", ".join(
                    f"rank {r} in {op}" for r, op in sorted(self.blocked.items()))
            waiting = [f"rank {r} in {c} on rank {w}" for r, pairs in sorted(self.waits.items())
                       for c, w in pairs]
            if waiting:
                text += "; collectives waiting: " + ", ".join(waiting)
        return text
