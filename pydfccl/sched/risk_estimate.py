"""Estimating how often rounds deadlock over a grid of (p, q): rounds in seeded blocks, so
that any number of worker processes gives the same counts; Wilson intervals; the table as
CSV or a plot."""

from __future__ import annotations

import csv
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from .risk_rounds import Topology, sample_round
from .risk_search import find_deadlock

__all__ = ["wilson_interval", "RiskRow", "risk_study", "write_csv", "plot"]

_BLOCK = 100  # rounds per job; each block has its own seed, so workers do not change results


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> Tuple[float, float]:
    """The Wilson score interval for k successes in n trials (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    phat = k / n
    denom = 1 + z * z / n
    center = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if k == 0 else min(phat, center - half)  # exact ends; no rounding past phat
    high = 1.0 if k == n else max(phat, center + half)
    return low, high


@dataclass(frozen=True)
class RiskRow:
    p: float
    q: float
    rounds: int
    deadlocks: int

    @property
    def probability(self) -> float:
        return self.deadlocks / self.rounds if self.rounds else 0.0

    @property
    def interval(self) -> Tuple[float, float]:
        return wilson_interval(self.deadlocks, self.rounds)


def _seed_for(seed: int, p: float, q: float, block: int) -> np.random.SeedSequence:
    bits = [int(np.float64(x).view(np.uint64)) for x in (p, q)]
    return np.random.SeedSequence([seed, *bits, block])


def _run_block(args) -> int:
    topo, p, q, seed, block, n, span = args
    rng = np.random.default_rng(_seed_for(seed, p, q, block))
    return sum(find_deadlock(topo, sample_round(topo, p, q, rng, span)) is not None
               for _ in range(n))


def risk_study(topo: Topology, ps: Sequence[float], qs: Sequence[float], rounds: int,
               seed: int = 0, workers: int = 1, progress: bool = False,
               skip_span: int = 1) -> List[RiskRow]:
    """Deadlocked rounds out of ``rounds`` for every (p, q); the same for any ``workers``.
    ``skip_span``: how many submissions a deferral moves its collective past."""
    jobs, owner = [], []
    for p in ps:
        for q in qs:
            for block in range(-(-rounds // _BLOCK)):
                n = min(_BLOCK, rounds - block * _BLOCK)
                jobs.append((topo, p, q, seed, block, n, skip_span))
                owner.append((p, q))
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            counts = list(_progress(pool.map(_run_block, jobs), len(jobs), progress))
    else:
        counts = list(_progress(map(_run_block, jobs), len(jobs), progress))
    total: Dict[Tuple[float, float], int] = {}
    for key, c in zip(owner, counts):
        total[key] = total.get(key, 0) + c
    return [RiskRow(p, q, rounds, total[(p, q)]) for p in ps for q in qs]


def _progress(it, total, enabled):
    if not enabled:
        return it
    try:
        from tqdm import tqdm
    except ImportError:
        return it
    return tqdm(it, total=total, unit="block", file=sys.stderr, leave=False)


def write_csv(path: str, topo: Topology, rows: List[RiskRow]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tp", "dp", "pp", "colls_tp", "colls_dp", "colls_pp", "p", "q", "rounds",
                    "deadlocks", "probability", "ci_low", "ci_high"])
        for row in rows:
            lo, hi = row.interval
            w.writerow([topo.tp, topo.dp, topo.pp, topo.colls_tp, topo.colls_dp, topo.colls_pp,
                        row.p, row.q, row.rounds, row.deadlocks, f"{row.probability:.6g}",
                        f"{lo:.6g}", f"{hi:.6g}"])


def plot(path: str, topo: Topology, rows: List[RiskRow]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for q in sorted({r.q for r in rows}):
        sel = sorted((r for r in rows if r.q == q), key=lambda r: r.p)
        ps = [r.p for r in sel]
        probs = [r.probability for r in sel]
        err = [[r.probability - r.interval[0] for r in sel],
               [r.interval[1] - r.probability for r in sel]]
        ax.errorbar(ps, probs, yerr=err, marker="o", capsize=3, label=f"q = {q:g}")
    if all(r.p > 0 for r in rows) and len({r.p for r in rows}) > 1:
        ax.set_xscale("log")
    ax.set_xlabel("p (probability of deferring a submission)")
    ax.set_ylabel("P(round deadlocks), 95% Wilson CI")
    ax.set_title(f"{topo.ngpus} GPUs, TP {topo.tp} x DP {topo.dp} x PP {topo.pp}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
