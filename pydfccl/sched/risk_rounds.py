"""The risk study's world: the TP x DP x PP grid (:class:`Topology`), the iteration template
every GPU follows, and one round's random deferrals and syncs (:class:`Round`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

import numpy as np

__all__ = ["TP", "DP", "PP_EVEN", "PP_ODD", "Topology", "PRESETS", "template", "Round",
           "sample_round", "make_round", "Runs"]

TP, DP, PP_EVEN, PP_ODD = 0, 1, 2, 3  # kinds of group: pipeline links (0,1),(2,3).. / (1,2)..


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
def template(topo: Topology):
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


def sample_round(topo: Topology, p: float, q: float, rng: np.random.Generator,
                 skip_span: int = 1) -> Round:
    """One round's draws. A deferral moves its collective past the next submission
    (``skip_span`` 1, the default), or past the next ``skip_span`` ones (the paper's skip of
    several positions): it counts as that many consecutive skips of its GPU, within the
    GPU's iteration."""
    if skip_span < 1:
        raise ValueError(f"skip_span must be >= 1, got {skip_span}")
    total = topo.ngpus * topo.nslots
    skips = _bernoulli_positions(total, p, rng)
    syncs = _bernoulli_positions(total, q, rng)
    if skip_span > 1 and len(skips):
        L = topo.nslots
        spread = skips[:, None] + np.arange(skip_span)[None, :]
        same_gpu = spread // L == skips[:, None] // L
        skips = np.unique(spread[same_gpu])
    return Round(skips, syncs)


def make_round(topo: Topology, skips: Sequence[Sequence[int]],
               syncs: Sequence[Sequence[int]]) -> Round:
    """A hand-made round: ``skips[g]`` and ``syncs[g]`` list GPU g's steps."""
    def flat(per_gpu):
        return np.array(sorted(g * topo.nslots + i for g, steps in enumerate(per_gpu)
                               for i in steps), dtype=np.int64)
    return Round(flat(skips), flat(syncs))


class Runs:
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
