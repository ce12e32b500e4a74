"""``python -m pydfccl risk --example``: one deadlocked round of the risk study, told as a
cycle a reader can follow: which GPU deferred which collective, and for each sync of the
cycle, the collective it waits for and the later sync of the peer that has not issued it."""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from .risk_rounds import DP, PP_EVEN, PP_ODD, TP, Round, Runs, Topology, sample_round, template
from .risk_search import find_deadlock

__all__ = ["find_example", "explain_round"]

KIND_NAMES = {TP: "TP", DP: "DP", PP_EVEN: "PP", PP_ODD: "PP"}


def find_example(topo: Topology, p: float, q: float, seed: int = 0, skip_span: int = 1,
                 max_rounds: int = 100_000) -> Optional[Tuple[int, Round, List[Tuple[int, int]]]]:
    """The first deadlocked round drawn with ``seed``: (its number, the round, the cycle of
    (gpu, step) syncs), or None within ``max_rounds``."""
    rng = np.random.default_rng(seed)
    for n in range(max_rounds):
        rnd = sample_round(topo, p, q, rng, skip_span)
        cycle = find_deadlock(topo, rnd)
        if cycle:
            return n, rnd, cycle
    return None


def _issue_steps(topo: Topology, runs: Runs, g: int) -> np.ndarray:
    """The step at which GPU g issues each slot's collective."""
    L = topo.nslots
    return runs.issue_steps(g * L + np.arange(L)) - g * L


def _coll(topo: Topology, slot: int) -> str:
    slots, _ = template(topo)
    return f"{KIND_NAMES[slots[slot]]} collective {slot}"


def explain_round(topo: Topology, rnd: Round, cycle: List[Tuple[int, int]]) -> str:
    """The deferrals of the cycle's GPUs and, for each sync of the cycle, why it waits for
    the next one."""
    L = topo.nslots
    slots, _ = template(topo)
    runs = Runs(rnd.skips, L)
    gpus = sorted({g for g, _ in cycle})
    issue = {g: _issue_steps(topo, runs, g) for g in {g for g, _ in cycle}}
    lines = ["What the cycle's GPUs did differently from the template (slot s is issued at "
             "step s unless deferred):"]
    for g in gpus:
        late = [(int(s), int(issue[g][s])) for s in range(L) if issue[g][s] > s]
        syncs = sorted(int(x % L) for x in rnd.syncs if x // L == g)
        said = ", ".join(f"deferred {_coll(topo, s)} from step {s} to step {i}"
                         for s, i in late) or "deferred nothing"
        lines.append(f"  GPU {g}: {said}; syncs before steps {syncs}")
    lines.append("The wait-for cycle (a sync before step i waits until every collective the "
                 "GPU issued before step i has completed on all its members):")
    for k, (g, i) in enumerate(cycle):
        h, j = cycle[(k + 1) % len(cycle)]
        head = f"  GPU {g}, sync before step {i}"
        if h == g:
            lines.append(f"{head}: comes after its own sync before step {j}, still waiting")
            continue
        waited = [s for s in range(L) if issue[g][s] < i and h in _members(topo, g, slots[s])
                  and issue[h][s] >= j]
        if waited:
            s = min(waited, key=lambda s: issue[g][s])
            lines.append(f"{head}: waits for {_coll(topo, s)} (issued at step {issue[g][s]}), "
                         f"which GPU {h} issues only at step {issue[h][s]}, after its sync "
                         f"before step {j}")
        else:
            lines.append(f"{head}: waits for GPU {h}'s sync before step {j}")
    ring = " -> ".join(f"GPU {g} (step {i})" for g, i in cycle + cycle[:1])
    lines.append(f"  so: {ring}: every sync waits for the next, and none returns")
    return "\n".join(lines)


def _members(topo: Topology, g: int, kind: int) -> List[int]:
    return topo.peers(g, kind)
