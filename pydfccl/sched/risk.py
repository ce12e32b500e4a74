"""The deadlock-risk study: how often NCCL-style training deadlocks under rare disorder and syncs.

The paper's simulator, rebuilt. GPUs form a TP x DP x PP grid; each GPU belongs to one
tensor-parallel group (the TP ranks of its data replica and stage), one data-parallel group
(same TP rank and stage) and, optionally, pipeline links to its neighbouring stages. Per
iteration every TP group runs ``colls_tp`` collectives and every DP group ``colls_dp``; all
GPUs interleave them by one template (spread evenly over the iteration), so without
perturbation every pair of GPUs agrees on the order of what they share. One round is one
iteration: at each of its submissions a GPU first syncs with probability q (its host blocks
until every collective it has issued completes) and then, with probability p, defers its
current collective (issues the next one instead; the deferred one stays first in line and
can be deferred again). NCCL semantics: issuing is asynchronous and never blocks; a
collective completes once every member of its group has issued it (each group has its own
communicator and stream, so collectives of different groups run side by side). A round
deadlocks when some syncs wait on each other in a cycle.

Why not strictly serial execution? If every GPU ran its collectives one at a time in issue
order, a sync would add no wait that the order does not already impose, so syncs could never
matter and almost every deferral would deadlock by itself; the paper reports the opposite
(deadlocks need syncs, and are more sensitive to them than to disorder).

The exact characterization that makes 3072 GPUs x 1600 submissions x 1000 rounds cheap:

* Give every sync a potential ``phi = 2 * i + h``: i its step (how many submissions the GPU
  made before it), h = 1 when a deferred collective H is still pending (a "hole").
* The syncs are the nodes of a dependency graph: a sync waits for the last sync of each group
  peer before the peer issues a collective the waiting GPU already issued (plus the GPU's own
  previous sync). If the peer lacks that collective because it has not come to it yet, the
  edge goes to a strictly smaller phi; only a *hole edge* -- the peer lacks exactly its deferred
  H -- can go up or stay level. So a cycle needs a deferral and, around it, syncs of two GPUs
  that share H's group: disordered relative order of two GPUs plus syncs, as the paper says.
* Walking a cycle, the phi ranges [phi(u), phi(t)] of its non-descending hole edges must cover
  all its phi values, so every cycle lies inside one cluster of overlapping such ranges. The
  study finds the hole edges, merges their ranges and looks for a cycle only among the few
  syncs inside those clusters (an ordinary depth-first search). For small p and q a round
  costs a few numpy calls; at p = q = 0.01 on the gpt3 preset about 15 ms.

``simulate_round`` is the plain event-by-event simulation of the same round; the tests check
that both agree.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "Topology",
    "PRESETS",
    "Round",
    "RiskRow",
    "sample_round",
    "make_round",
    "find_deadlock",
    "simulate_round",
    "wilson_interval",
    "risk_study",
    "write_csv",
    "plot",
    "main",
]

TP, DP, PP_EVEN, PP_ODD = 0, 1, 2, 3  # kinds of group: pipeline links (0,1),(2,3).. / (1,2)..
_BLOCK = 100  # rounds per job; each block has its own seed, so workers do not change results


@dataclass(frozen=True)
class Topology:
    """A TP x DP x PP grid and how many collectives each group runs per iteration.

    GPU ``g = (stage * dp + replica) * tp + tp_rank``. Pipeline point-to-point transfers
    (``colls_pp`` per link) are modelled as two-member groups: links (0,1), (2,3), ... use one
    set of template slots, links (1,2), (3,4), ... another; a GPU without a link in a slot
    issues a one-member collective there, which completes at once.
    """

    tp: int
    dp: int
    pp: int
    colls_tp: int
    colls_dp: int
    colls_pp: int = 0

    def __post_init__(self):
        if min(self.tp, self.dp, self.pp) < 1:
            raise ValueError("tp, dp and pp must be >= 1")
        if min(self.colls_tp, self.colls_dp, self.colls_pp) < 0:
            raise ValueError("collective counts must be >= 0")
        if self.nslots == 0:
            raise ValueError("no collectives: give colls_tp, colls_dp or colls_pp > 0")

    @property
    def ngpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def kinds(self) -> Tuple[int, ...]:
        out = [TP] * self.colls_tp + [DP] * self.colls_dp
        if self.pp > 1:
            out += [PP_EVEN] * self.colls_pp + [PP_ODD] * self.colls_pp
        return tuple(out)

    @property
    def nslots(self) -> int:
        return len(self.kinds)

    def peers(self, g: int, kind: int) -> List[int]:
        """The other members of GPU g's group of this kind."""
        tp, dp = self.tp, self.dp
        t, rest = g % tp, g // tp
        d, s = rest % dp, rest // dp
        if kind == TP:
            return [g - t + x for x in range(tp) if x != t]
        if kind == DP:
            return [(s * dp + x) * tp + t for x in range(dp) if x != d]
        partner = (s ^ 1) if kind == PP_EVEN else (s + 1 if s % 2 else s - 1)
        if 0 <= partner < self.pp and partner != s:
            return [g + (partner - s) * dp * tp]
        return []

    def group(self, g: int, kind: int) -> int:
        """A name for g's group of this kind: its smallest member."""
        return min([g] + self.peers(g, kind))


PRESETS: Dict[str, dict] = {
    "small": dict(topology=Topology(tp=2, dp=2, pp=2, colls_tp=6, colls_dp=6),
                  p=(0.01, 0.05, 0.2), q=(0.01, 0.05, 0.2), rounds=2000),
    "gpt3": dict(topology=Topology(tp=8, dp=6, pp=64, colls_tp=400, colls_dp=1200),
                 p=(0.0001, 0.001, 0.01), q=(0.0001, 0.001, 0.01), rounds=1000),
}


@lru_cache(maxsize=None)
def _template(topo: Topology):
    """Slot order (kinds spread evenly over the iteration) and, per kind, the last slot of
    that kind strictly before each position (-1 if none)."""
    raw = np.array(topo.kinds)
    counts = {k: int(np.count_nonzero(raw == k)) for k in range(4)}
    index = np.zeros(len(raw))
    for k, n in counts.items():
        index[raw == k] = (np.arange(n) + 0.5) / max(n, 1)
    slots = raw[np.lexsort((raw, index))]
    prev = {}
    for k in range(4):
        where = np.where(slots == k, np.arange(len(slots)), -1)
        prev[k] = np.concatenate(([-1], np.maximum.accumulate(where))).tolist()
    return slots.tolist(), prev


@dataclass
class Round:
    """One round's random draws, as sorted flat positions ``gpu * nslots + step``: the
    submissions that defer their collective and those preceded by a sync."""

    skips: np.ndarray
    syncs: np.ndarray


def _bernoulli_positions(total: int, prob: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted positions in [0, total) that each hold with probability ``prob``."""
    if prob <= 0:
        return np.zeros(0, dtype=np.int64)
    if prob >= 1:
        return np.arange(total, dtype=np.int64)
    expected = total * prob
    size = int(expected + 6 * math.sqrt(expected) + 16)
    pos = np.cumsum(rng.geometric(prob, size=size)) - 1
    while pos[-1] < total:
        more = np.cumsum(rng.geometric(prob, size=size)) + pos[-1]
        pos = np.concatenate((pos, more))
    return pos[pos < total].astype(np.int64)


def sample_round(topo: Topology, p: float, q: float, rng: np.random.Generator) -> Round:
    total = topo.ngpus * topo.nslots
    return Round(_bernoulli_positions(total, p, rng), _bernoulli_positions(total, q, rng))


def make_round(topo: Topology, skips: Sequence[Sequence[int]],
               syncs: Sequence[Sequence[int]]) -> Round:
    """A hand-made round: ``skips[g]`` and ``syncs[g]`` list GPU g's steps."""
    def flat(per_gpu):
        return np.array(sorted(g * topo.nslots + i for g, steps in enumerate(per_gpu)
                               for i in steps), dtype=np.int64)
    return Round(flat(skips), flat(syncs))


class _Runs:
    """The deferrals of a round: run k defers slot ``start[k] % L`` of its GPU past the next
    ``length[k]`` slots (one per consecutive skip)."""

    def __init__(self, skips: np.ndarray, L: int):
        skips = skips[skips % L != L - 1]  # the last submission has nothing to defer past
        if len(skips):
            first = np.flatnonzero(np.r_[True, np.diff(skips) != 1])
            self.start = skips[first]
            self.length = np.diff(np.r_[first, len(skips)])
        else:
            self.start = self.length = np.zeros(0, dtype=np.int64)

    def issue_steps(self, flat_slots: np.ndarray) -> np.ndarray:
        """The flat step at which each flat slot's collective is issued."""
        if len(self.start) == 0:
            return flat_slots.copy()
        idx = np.searchsorted(self.start, flat_slots, side="left")
        here = np.minimum(idx, len(self.start) - 1)
        before = np.maximum(idx - 1, 0)
        deferred = self.start[here] == flat_slots
        pulled = (idx > 0) & (self.start[before] + self.length[before] >= flat_slots)
        return np.where(deferred, flat_slots + self.length[here],
                        np.where(pulled, flat_slots - 1, flat_slots))


def _peer_pairs(topo: Topology, gpus: np.ndarray, kinds: np.ndarray):
    """All (row, peer) with ``peer`` in the group of kind ``kinds[row]`` of ``gpus[row]``."""
    tp, dp = topo.tp, topo.dp
    rows, peers = [], []
    t = gpus % tp
    s = gpus // (tp * dp)
    for kind in np.unique(kinds).tolist():
        sel = np.flatnonzero(kinds == kind)
        g = gpus[sel]
        if kind == TP:
            cand = (g - t[sel])[:, None] + np.arange(tp)[None, :]
        elif kind == DP:
            cand = (s[sel, None] * dp + np.arange(dp)[None, :]) * tp + t[sel, None]
        else:
            st = s[sel]
            partner = st ^ 1 if kind == PP_EVEN else np.where(st % 2 == 1, st + 1, st - 1)
            cand = np.where((partner >= 0) & (partner < topo.pp), g + (partner - st) * dp * tp,
                            g)[:, None]
        keep = cand != g[:, None]
        rows.append(np.broadcast_to(sel[:, None], cand.shape)[keep])
        peers.append(cand[keep])
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return np.concatenate(rows), np.concatenate(peers)


def find_deadlock(topo: Topology, rnd: Round) -> Optional[List[Tuple[int, int]]]:
    """A cycle of waiting syncs as ``[(gpu, step), ...]`` (each waits on the next), or None."""
    L = topo.nslots
    slots, prev_slot = _template(topo)
    runs = _Runs(rnd.skips, L)
    sy = rnd.syncs[rnd.syncs % L != 0]  # a sync before the first submission waits for nothing
    if len(sy) == 0 or len(runs.start) == 0:
        return None
    # hole syncs: inside a run (start < sync <= start + length), the deferred slot still pending
    k = np.maximum(np.searchsorted(runs.start, sy, side="left") - 1, 0)
    inside = (runs.start[k] < sy) & (sy <= runs.start[k] + runs.length[k])
    if not inside.any():
        return None
    phi = 2 * (sy % L) + inside
    hole_of = np.where(inside, runs.start[k], -1)

    # hole edges u -> t: t is the last sync of GPU b before b issues its deferred slot H; u is
    # the first sync of a group peer a after a issued H (later syncs of a reach u anyway).
    holes = np.flatnonzero(inside)
    t_all = holes[np.r_[hole_of[holes][1:] != hole_of[holes][:-1], True]]
    b, j = np.divmod(hole_of[t_all], L)
    row, peer = _peer_pairs(topo, b, np.asarray(slots)[j])
    u = np.searchsorted(sy, runs.issue_steps(peer * L + j[row]), side="right")
    ok = u < len(sy)
    ok[ok] = sy[u[ok]] // L == peer[ok]
    edge_u, edge_t = u[ok], t_all[row[ok]]
    up = phi[edge_t] >= phi[edge_u]
    if not up.any():
        return None

    # every cycle lies inside one cluster of overlapping [phi(u), phi(t)] of upward hole edges
    clusters = _merge(sorted(zip(phi[edge_u[up]].tolist(), phi[edge_t[up]].tolist())))
    lo = np.array([c[0] for c in clusters])
    hi = np.array([c[1] for c in clusters])
    ci = np.searchsorted(lo, phi, side="right") - 1
    member = (ci >= 0) & (phi <= hi[np.maximum(ci, 0)])
    cluster_of = np.where(member, ci, -1)
    same = cluster_of[edge_u] == cluster_of[edge_t]
    hole_edges = list(zip(edge_u[same & member[edge_u]].tolist(),
                          edge_t[same & member[edge_u]].tolist()))
    nodes_all = np.flatnonzero(member)
    info = {n: (g_, i_, h_, f_) for n, g_, i_, h_, f_ in zip(
        nodes_all.tolist(), (sy[nodes_all] // L).tolist(), (sy[nodes_all] % L).tolist(),
        hole_of[nodes_all].tolist(), phi[nodes_all].tolist())}
    by_cluster: Dict[int, List[int]] = {}
    for n, c in zip(nodes_all.tolist(), cluster_of[nodes_all].tolist()):
        by_cluster.setdefault(c, []).append(n)
    for c in sorted(by_cluster):
        cycle = _cycle_in_cluster(topo, by_cluster[c], info, hole_edges, slots, prev_slot, L)
        if cycle:
            return [info[n][:2] for n in cycle]
    return None


def _merge(intervals):
    out = []
    for lo, hi in intervals:
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _cycle_in_cluster(topo, nodes, info, hole_edges, slots, prev_slot, L):
    """Depth-first search for a cycle among the syncs ``nodes`` of one cluster.

    ``info[n] = (gpu, step, flat hole slot or -1, phi)``; node numbers follow the syncs'
    flat positions, so n - 1 is the previous sync (of the same GPU or not).
    """
    members = set(nodes)
    per_gpu: Dict[int, List[int]] = {}
    for n in nodes:  # ascending, so ascending phi per GPU
        per_gpu.setdefault(info[n][0], []).append(n)
    keys = {g: [info[n][3] for n in ns] for g, ns in per_gpu.items()}
    succ: Dict[int, List[int]] = {n: [] for n in nodes}
    for u, t in hole_edges:
        if u in members:
            succ[u].append(t)
    kinds = sorted(set(slots))
    for n in nodes:
        g, i, hole, _ = info[n]
        if n - 1 in members and info[n - 1][0] == g:
            succ[n].append(n - 1)                      # the GPU's own previous sync
        front = i + 1 if hole >= 0 else i              # slots < front issued, except the hole
        hole_slot = hole % L if hole >= 0 else -1
        for kind in kinds:
            last = prev_slot[kind][front]
            if last == hole_slot >= 0:
                last = prev_slot[kind][hole_slot]
            if last < 0:
                continue
            for h in topo.peers(g, kind):
                ks = keys.get(h)
                if ks:  # the peer's latest sync that has not issued slot `last` yet
                    x = bisect.bisect_right(ks, 2 * last) - 1
                    if x >= 0:
                        succ[n].append(per_gpu[h][x])
    state: Dict[int, int] = {}
    for root in nodes:
        if root in state:
            continue
        path, stack = [root], [iter(succ[root])]
        state[root] = 1
        while stack:
            for nxt in stack[-1]:
                if state.get(nxt) == 1:
                    return path[path.index(nxt):]
                if nxt not in state:
                    state[nxt] = 1
                    path.append(nxt)
                    stack.append(iter(succ[nxt]))
                    break
            else:
                stack.pop()
                state[path.pop()] = 2
    return None


def simulate_round(topo: Topology, rnd: Round) -> bool:
    """The same round, simulated event by event (slow; small topologies). True: deadlock."""
    L = topo.nslots
    slots, _ = _template(topo)
    runs = _Runs(rnd.skips, L)
    syncset = set(rnd.syncs.tolist())
    programs = []
    for g in range(topo.ngpus):
        steps = runs.issue_steps(g * L + np.arange(L)) - g * L
        issue_at = dict(zip(steps.tolist(), range(L)))
        prog = []
        for i in range(L):
            if g * L + i in syncset:
                prog.append(None)
            j = issue_at[i]
            prog.append((j, topo.group(g, slots[j])))
        programs.append(prog)
    size = {}
    for g in range(topo.ngpus):
        for j in range(L):
            size[(j, topo.group(g, slots[j]))] = 1 + len(topo.peers(g, slots[j]))
    issued: Dict[tuple, int] = {}
    inflight: List[List[tuple]] = [[] for _ in programs]
    pc = [0] * len(programs)
    moved = True
    while moved:
        moved = False
        for g, prog in enumerate(programs):
            while pc[g] < len(prog):
                ev = prog[pc[g]]
                if ev is None:
                    if any(issued[c] < size[c] for c in inflight[g]):
                        break
                    inflight[g].clear()
                else:
                    issued[ev] = issued.get(ev, 0) + 1
                    inflight[g].append(ev)
                pc[g] += 1
                moved = True
    return any(pc[g] < len(prog) for g, prog in enumerate(programs))


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
    topo, p, q, seed, block, n = args
    rng = np.random.default_rng(_seed_for(seed, p, q, block))
    return sum(find_deadlock(topo, sample_round(topo, p, q, rng)) is not None for _ in range(n))


def risk_study(topo: Topology, ps: Sequence[float], qs: Sequence[float], rounds: int,
               seed: int = 0, workers: int = 1, progress: bool = False) -> List[RiskRow]:
    """Deadlocked rounds out of ``rounds`` for every (p, q); the same for any ``workers``."""
    jobs, owner = [], []
    for p in ps:
        for q in qs:
            for block in range(-(-rounds // _BLOCK)):
                n = min(_BLOCK, rounds - block * _BLOCK)
                jobs.append((topo, p, q, seed, block, n))
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


# --- command line --------------------------------------------------------------------------

_PAPER = {(0.001, 0.001): "paper: 2.8% of rounds (GPT-3, 3072 GPUs)"}


def _floats(text: str) -> List[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"probabilities must lie in [0, 1]: {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pydfccl risk",
        description="Estimate how often NCCL-style training deadlocks when each submission "
                    "is deferred with probability p and preceded by a GPU sync with "
                    "probability q (the DFCCL paper's risk study).")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small",
                    help="topology, grid and rounds to start from (default: small)")
    for name, help_ in (("tp", "tensor-parallel group size"), ("dp", "data-parallel group size"),
                        ("pp", "pipeline stages"),
                        ("colls-tp", "collectives per TP group per iteration"),
                        ("colls-dp", "collectives per DP group per iteration"),
                        ("colls-pp", "point-to-point transfers per pipeline link per iteration")):
        ap.add_argument(f"--{name}", type=int, help=help_ + " (default: the preset's)")
    ap.add_argument("--p", type=_floats, help="disorder probabilities, e.g. 0.001,0.01")
    ap.add_argument("--q", type=_floats, help="sync probabilities, e.g. 0.001,0.01")
    ap.add_argument("--rounds", type=int, help="rounds (iterations) per grid point")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--workers", type=int, default=1,
                    help=f"processes (default 1; this machine has {os.cpu_count()} CPUs)")
    ap.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    ap.add_argument("--plot", metavar="FILE.png", help="also plot P(deadlock) against p")
    ap.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    return ap


def _table(topo: Topology, rows: List[RiskRow]) -> str:
    head = (f"{topo.ngpus} GPUs = TP {topo.tp} x DP {topo.dp} x PP {topo.pp}; "
            f"{topo.colls_tp} collectives per TP group, {topo.colls_dp} per DP group"
            + (f", {topo.colls_pp} per pipeline link" if topo.colls_pp and topo.pp > 1 else "")
            + f"; {topo.nslots} submissions per GPU per round")
    lines = [head, f"{'p':>10} {'q':>10} {'rounds':>7} {'deadlocks':>9} {'P(deadlock)':>11}  "
                   f"{'95% CI (Wilson)':<19}"]
    for row in rows:
        lo, hi = row.interval
        note = _PAPER.get((row.p, row.q), "") if topo == PRESETS["gpt3"]["topology"] else ""
        lines.append(f"{row.p:>10g} {row.q:>10g} {row.rounds:>7} {row.deadlocks:>9} "
                     f"{row.probability:>10.2%}  [{lo:7.2%}, {hi:7.2%}]  {note}".rstrip())
    return "\n".join(lines)


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


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    preset = PRESETS[args.preset]
    base = preset["topology"]
    pick = lambda value, default: default if value is None else value
    try:
        topo = Topology(pick(args.tp, base.tp), pick(args.dp, base.dp), pick(args.pp, base.pp),
                        pick(args.colls_tp, base.colls_tp), pick(args.colls_dp, base.colls_dp),
                        pick(args.colls_pp, base.colls_pp))
    except ValueError as exc:
        print(f"risk: {exc}", file=sys.stderr)
        return 2
    rounds = pick(args.rounds, preset["rounds"])
    if rounds < 1 or args.workers < 1:
        print("risk: --rounds and --workers must be >= 1", file=sys.stderr)
        return 2
    rows = risk_study(topo, pick(args.p, preset["p"]), pick(args.q, preset["q"]), rounds,
                      seed=args.seed, workers=args.workers, progress=args.progress)
    print(_table(topo, rows))
    if args.csv:
        write_csv(args.csv, topo, rows)
    if args.plot:
        plot(args.plot, topo, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
