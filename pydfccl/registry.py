"""What ``start()`` settles across ranks: that their registrations agree, and where every
collective lives (its index in the daemons' tables and its connector sets).

Collectives are registered on every rank with the same signature. Point-to-point
transfers are registered on two ranks only: a ``send`` whose ``peer`` is a rank that
registered the same id as a ``recv`` whose ``peer`` is the sender, with the same count and
dtype. Every rank learns every rank's registrations (the exchange), so every rank computes
the same index and connector sets for every id, including ids it did not register.
"""

from __future__ import annotations

import collections

from .codes import KINDS, POINT_TO_POINT
from .kernels.plans import connector_sets

__all__ = ["check_signatures", "placement"]


def _differing(coll_id, field, values: dict) -> ValueError:
    groups = collections.defaultdict(list)
    for r, v in values.items():
        groups[v].append(r)
    detail = "; ".join(f"ranks {rs}: {v!r}" for v, rs in groups.items())
    return ValueError(f"collective {coll_id}: field {field!r} differs across ranks ({detail})")


def _check_pair(coll_id, holders: dict) -> None:
    """A point-to-point id: one send and one recv whose peers name each other."""
    kinds = sorted(sig["kind"] for sig in holders.values())
    if len(holders) != 2 or kinds != ["recv", "send"]:
        described = {r: sig["kind"] for r, sig in holders.items()}
        raise ValueError(f"collective {coll_id}: a point-to-point transfer is one 'send' and "
                         f"one 'recv' on two ranks; prepared as {described}")
    (a, sa), (b, sb) = holders.items()
    if sa["root"] != b or sb["root"] != a:
        raise ValueError(f"collective {coll_id}: rank {a} names peer {sa['root']} and rank {b} "
                         f"names peer {sb['root']}; each must name the other")
    for field in ("count", "dtype"):
        if sa[field] != sb[field]:
            raise _differing(coll_id, field, {a: sa[field], b: sb[field]})


def check_signatures(per_rank: list) -> None:
    """Raise ValueError naming the collective, field and ranks where ``prepare`` differed.
    ``per_rank[r]`` maps rank r's collective ids to their signatures."""
    p2p = {cid for sigs in per_rank for cid, sig in sigs.items() if sig["kind"] in POINT_TO_POINT}
    ids = [sorted(set(sigs) - p2p) for sigs in per_rank]
    for r, rank_ids in enumerate(ids):
        if rank_ids != ids[0]:
            missing = sorted(set(ids[0]) ^ set(rank_ids))
            raise ValueError(f"collective ids differ across ranks: rank 0 prepared {ids[0]}, "
                             f"rank {r} prepared {rank_ids} (differing: {missing})")
    for coll_id in ids[0]:
        for field in per_rank[0][coll_id]:
            values = {r: sigs[coll_id][field] for r, sigs in enumerate(per_rank)}
            if len(set(values.values())) > 1:
                raise _differing(coll_id, field, values)
    for coll_id in sorted(p2p):
        _check_pair(coll_id, {r: sigs[coll_id] for r, sigs in enumerate(per_rank)
                              if coll_id in sigs})


def placement(per_rank: list, nranks: int) -> tuple[dict, dict, int]:
    """({coll_id: index}, {coll_id: first connector set}, connector sets used), the same on
    every rank: ids in sorted order over all ranks' registrations."""
    kinds = {}
    for sigs in per_rank:
        for cid, sig in sigs.items():
            kinds[cid] = sig["kind"]
    index, conn, used = {}, {}, 0
    for i, cid in enumerate(sorted(kinds)):
        index[cid] = i
        conn[cid] = used
        used += connector_sets(KINDS[kinds[cid]], nranks)
    return index, conn, used
