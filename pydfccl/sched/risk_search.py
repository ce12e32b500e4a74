"""Finding a deadlocked round: the exact search over hole edges and clusters of syncs
(:func:`find_deadlock`; why it is exact: :mod:`pydfccl.sched.risk`) and the plain
event-by-event simulation it is checked against (:func:`simulate_round`)."""

from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Tuple

import numpy as np

from .risk_rounds import DP, PP_EVEN, TP, Round, Runs, Topology, template

__all__ = ["find_deadlock", "simulate_round"]


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
    slots, prev_slot = template(topo)
    runs = Runs(rnd.skips, L)
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
    slots, _ = template(topo)
    runs = Runs(rnd.skips, L)
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
