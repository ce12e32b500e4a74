"""A bounded random trial of a policy in the model: what ``check-policy`` runs after the
typed check, without Hypothesis (a runtime of its own, seeded, bounded in examples and
seconds).

Each example draws 2-4 ranks, 1-4 all-reduces of 1-12 elements with priorities, each rank
in the common order or its own, device syncs before any submission, slot counts, one-shot
limits, relaunch pauses and a tick order; the oracle is the one the property tests use
(``docs/scheduling.md``, "What the model guarantees"): a preemptive policy completes every
such schedule (no ``wait_all``) with exact sums; a policy that is not preemptive completes
those where every rank submits in the same order and no device sync follows a submission.
The first failure comes back as a :class:`~.counterexample.Counterexample`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Optional

from .counterexample import Counterexample
from .model import COMPLETED, SYNC, Collective, Schedule, run_schedule, submit
from .policies import get_policy

__all__ = ["TrialReport", "random_schedule", "random_options", "trial"]


@dataclass(frozen=True)
class TrialReport:
    examples: int
    seconds: float
    failure: Optional[Counterexample] = None


def random_schedule(rng: random.Random, ordered: bool = False) -> Schedule:
    """``ordered``: every rank submits in the same order, with syncs only before the first."""
    nranks, ncolls = rng.randint(2, 4), rng.randint(1, 4)
    common = list(range(ncolls))
    ranks = []
    for _ in range(nranks):
        order = list(common)
        if not ordered and rng.random() < 0.5:
            rng.shuffle(order)
        program = []
        for i, c in enumerate(order):
            if rng.random() < 0.3 and (not ordered or i == 0):
                program.append(SYNC)
            program.append(submit(c))
        if not ordered and rng.random() < 0.3:
            program.append(SYNC)
        ranks.append(program)
    colls = {c: Collective(rng.randint(1, 12), rng.randint(0, 2)) for c in common}
    return Schedule(nranks, colls, ranks)


def random_options(rng: random.Random, nranks: int) -> dict:
    return dict(nslots=rng.randint(2, 4), slot_elems=rng.randint(1, 3),
                one_shot_elems=rng.choice([0, 0, 1, 3]), relaunch_ticks=rng.randint(1, 20),
                seed=rng.choice([None, rng.randint(0, 1 << 16)]),
                start_ticks=rng.choice([None, [rng.randint(0, 40) for _ in range(nranks)]]))


def trial(policy, examples: int = 300, seconds: float = 20.0, seed: int = 0) -> TrialReport:
    """Up to ``examples`` random schedules (fewer once ``seconds`` are spent); the first
    that breaks the oracle ends the trial as ``failure``."""
    spec = policy if isinstance(policy, str) else None
    policy = get_policy(policy)
    rng = random.Random(seed)
    started = time.perf_counter()
    done = 0
    while done < examples and time.perf_counter() - started < seconds:
        schedule = random_schedule(rng, ordered=not policy.preemptive)
        options = random_options(rng, schedule.nranks)
        res = run_schedule(schedule, policy, **options)
        done += 1
        if res.outcome != COMPLETED or not res.exact:
            found = Counterexample.of(schedule, policy, options=options, seed=seed)
            if spec is not None:
                found = Counterexample(schedule, spec, found.params, options, seed)
            return TrialReport(done, time.perf_counter() - started,
                               found.with_model())
    return TrialReport(done, time.perf_counter() - started)
