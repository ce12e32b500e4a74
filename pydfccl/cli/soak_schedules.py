"""The soak's schedules: each drawn from a generator seeded by (seed, schedule index), so
that it is the same on every machine and can be rerun alone. A schedule is plain data
(it crosses to the rank processes): a rank count, a few collectives of every kind, op and
dtype the engine implements, how many times each runs, every rank's own submission order
and priorities, and where each rank synchronizes the device between submissions."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..host.world_config import WorldConfig
from ..protocol.codes import COLLECTIVE_KINDS, DTYPES, OPS, OUT_OF_PLACE_ONLY
from ..protocol.reference import buffer_elems, reference
from ..sched.policies import Policy

__all__ = ["SoakOptions", "Collective", "Schedule", "draw_schedule", "soak_input",
           "soak_inputs", "expected_output", "ROOTED"]

ROOTED = ("broadcast", "reduce")
SYNC_CHANCE = 0.25      # of a device-wide synchronize after a submission
REPEAT_CHANCE = 0.3     # of a collective running twice (its runs meet in order across ranks)
MAX_PRIORITY = 3


@dataclass(frozen=True)
class SoakOptions:
    schedules: int | None = 10      # None: until ``seconds`` have passed
    seconds: float | None = None    # start no new schedule after this wall time
    seed: int = 0
    max_ranks: int = 3
    max_count: int = 200
    max_colls: int = 4
    policy: Policy | str = "dfccl"    # an object (with --param's overrides) or a name
    progress: bool = True
    only: int | None = None         # run just this schedule index (to reproduce a failure)
    result_timeout: float = 300.0
    launch_timeout: float = 900.0


@dataclass(frozen=True)
class Collective:
    kind: str
    count: int
    dtype: str
    op: str
    root: int
    runs: int
    in_place: bool

    def describe(self) -> str:
        extras = [f"root {self.root}"] * (self.kind in ROOTED) + ["in place"] * self.in_place
        runs = f" x{self.runs}" if self.runs > 1 else ""
        return f"{self.kind}{runs} ({', '.join([f'{self.count} {self.dtype}', self.op] + extras)})"


@dataclass(frozen=True)
class Schedule:
    """One schedule, as plain data so that it crosses to rank processes. Per rank:
    ``orders`` lists collective ids in submission order (an id once per run),
    ``priorities`` each collective's prepared priority, ``run_priorities`` each
    submission's, ``syncs`` the positions after which the rank synchronizes the device."""

    index: int
    nranks: int
    colls: tuple
    orders: tuple
    priorities: tuple
    run_priorities: tuple
    syncs: tuple

    def describe(self) -> str:
        colls = "; ".join(f"{c}: {coll.describe()}" for c, coll in enumerate(self.colls))
        return (f"schedule {self.index}: {self.nranks} ranks; {colls}; orders "
                f"{[list(o) for o in self.orders]}; syncs after positions "
                f"{[sorted(s) for s in self.syncs]}")


def _draw_count(rng, max_count: int, slot_elems: int) -> int:
    """1, one element either side of a whole number of slots, or anything up to max_count."""
    near_slots = [k * slot_elems + d for k in (1, 2) for d in (-1, 1)
                  if 1 <= k * slot_elems + d <= max_count]
    pick = rng.integers(4)
    if pick == 0:
        return 1
    if pick == 1 and near_slots:
        return int(rng.choice(near_slots))
    return int(rng.integers(1, max_count + 1))


def draw_schedule(seed: int, index: int, opts: SoakOptions, simulator: bool) -> Schedule:
    """Schedule ``index`` of the run seeded ``seed``: the same on every machine and
    independent of the others, so one can be rerun alone (``--only``)."""
    rng = np.random.default_rng([seed, index])
    nranks = int(rng.integers(2, opts.max_ranks + 1))
    slot_bytes = WorldConfig(nranks, simulator=simulator).slot_bytes
    colls = []
    for _ in range(int(rng.integers(1, opts.max_colls + 1))):
        kind, op, dtype = (str(rng.choice(list(t)))
                           for t in (COLLECTIVE_KINDS, OPS, DTYPES))
        colls.append(Collective(
            kind=kind, op=op, dtype=dtype,
            count=_draw_count(rng, opts.max_count, slot_bytes // np.dtype(dtype).itemsize),
            root=int(rng.integers(nranks)) if kind in ROOTED else 0,
            runs=2 if rng.random() < REPEAT_CHANCE else 1,
            in_place=kind not in OUT_OF_PLACE_ONLY and bool(rng.integers(2))))
    runs = [c for c, coll in enumerate(colls) for _ in range(coll.runs)]
    return Schedule(
        index=index, nranks=nranks, colls=tuple(colls),
        orders=tuple(tuple(int(c) for c in rng.permutation(runs)) for _ in range(nranks)),
        priorities=tuple(tuple(int(p) for p in rng.integers(0, MAX_PRIORITY + 1, len(colls)))
                         for _ in range(nranks)),
        run_priorities=tuple(tuple(int(p) for p in rng.integers(0, MAX_PRIORITY + 1, len(runs)))
                             for _ in range(nranks)),
        syncs=tuple(frozenset(int(j) for j in np.flatnonzero(rng.random(len(runs)) < SYNC_CHANCE))
                    for _ in range(nranks)))


def soak_input(rank: int, coll: int, run: int, count: int, dtype: str, op: str,
               nranks: int) -> np.ndarray:
    """Rank ``rank``'s send buffer for one run: small positive integers, so that every op is
    exact in every dtype (a sum of ``nranks`` of them fits in int8; a product is of 1s and
    2s, and wraps in 8-bit integers the same way on the device and in numpy)."""
    span = 2 if op == "prod" else max(1, min(13, 127 // nranks))
    return (((np.arange(count) + 7 * coll + 3 * run + rank) % span) + 1).astype(dtype)


def soak_inputs(coll: int, run: int, count: int, dtype: str, op: str,
                nranks: int) -> np.ndarray:
    """Every rank's ``soak_input`` for one run at once: row r is rank r's (one numpy
    expression instead of one a rank, for each run each rank checks)."""
    span = 2 if op == "prod" else max(1, min(13, 127 // nranks))
    ranks = np.arange(nranks)[:, None]
    return (((np.arange(count)[None, :] + 7 * coll + 3 * run + ranks) % span) + 1).astype(dtype)


def expected_output(schedule: Schedule, coll: int, run: int, rank: int):
    """numpy's answer for one rank's run (None where NCCL leaves the output unspecified)."""
    spec, n = schedule.colls[coll], schedule.nranks
    send_elems, _ = buffer_elems(spec.kind, spec.count, n)
    inputs = list(soak_inputs(coll, run, send_elems, spec.dtype, spec.op, n))
    return reference(spec.kind, inputs, spec.op, spec.root, rank)
