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

from ..protocol.codes import DTYPES, KINDS, OPS, POINT_TO_POINT
from ..protocol.collectives import collective

__all__ = ["check_signatures", "placement", "members", "member", "LatePlacer", "late_verdict",
           "published_signature", "check_published", "SHARE", "SHARE_MODES", "shared_by_all",
           "overflow_slots"]

SHARE = "share_slots"   # in start()'s exchange beside the signatures: start(share_slots=...)
SHARE_MODES = (False, True, "overflow")


def overflow_slots(nranks: int, max_colls: int) -> int:
    """The slots ``start(share_slots="overflow")`` keeps for the collectives beyond the
    others: an eighth of ``max_colls``, or an all_to_all's ``nranks - 1`` if that is more."""
    return max(nranks - 1, max_colls // 8, 1)


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


def shared_by_all(per_rank: list) -> tuple[list, bool | str]:
    """(the signatures without ``SHARE``, the ``share_slots`` every rank passed); ValueError
    naming the ranks when they differ."""
    modes = [sigs.get(SHARE, False) for sigs in per_rank]
    if len(set(modes)) > 1:
        by_mode = collections.defaultdict(list)
        for r, mode in enumerate(modes):
            by_mode[mode].append(r)
        if len(by_mode) == 2 and False in by_mode:
            (mode, sharing), = ((m, rs) for m, rs in by_mode.items() if m is not False)
            raise ValueError(f"start(share_slots={mode!r}) on ranks {sharing} but not on "
                             f"ranks {by_mode[False]}: every rank must pass the same")
        detail = "; ".join(f"ranks {rs}: {m!r}" for m, rs in by_mode.items())
        raise ValueError(f"start(share_slots=...) differs across ranks ({detail}): every "
                         "rank must pass the same")
    return [{cid: sig for cid, sig in sigs.items() if cid != SHARE}
            for sigs in per_rank], modes[0]


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
        used += collective(kinds[cid]).connector_sets(nranks)
    return index, conn, used


def member(kind: str, root: int, rank: int, nranks: int) -> tuple:
    """(slots, ranks that run it) of a collective ``rank`` registered (``root``: a
    transfer's peer)."""
    ranks = (tuple(sorted((rank, root))) if kind in POINT_TO_POINT
             else tuple(range(nranks)))
    return collective(kind).connector_sets(nranks), ranks


def members(per_rank: list, nranks: int) -> dict:
    """{coll_id: (slots it needs, ranks that run it)} of every rank's registrations, the
    same on every rank: for collectives that share slots (``host/slots.py``)."""
    out = {}
    for r, sigs in enumerate(per_rank):
        for cid, sig in sigs.items():
            if cid in out:
                continue
            out[cid] = member(sig["kind"], sig["root"], r, nranks)
    return out


class LatePlacer:
    """Index and connector sets of collectives prepared after ``start()``, computed alike on
    every rank without an exchange.

    Collectives of every rank go after the ones placed at start, in the order they are
    prepared: every rank prepares them in the same order (torch requires that of a process
    group), or ``late_verdict`` reports the difference. A point-to-point transfer is seen by
    its two ranks only, so it takes a place fixed by its (sender, receiver) pair and its
    ordinal on that pair, counted down from the top: index and connector set are the same
    number, unique in the world, so no pool holds two users of one set. The two regions
    must not meet; the ranks of a transfer notice when they would."""

    def __init__(self, nranks: int, max_colls: int, next_index: int, next_conn: int):
        self.nranks, self.max_colls = nranks, max_colls
        self.next_index, self.next_conn = next_index, next_conn
        self.lowest_transfer = max_colls       # lowest place a transfer of this rank took
        self.ordinals = collections.Counter()  # (sender, receiver) -> transfers placed

    def _full(self, what: str) -> ValueError:
        return ValueError(f"no room for {what}: the collectives prepared after start() use "
                          f"{self.next_conn} connector sets and the point-to-point transfers "
                          f"the places from {self.lowest_transfer} up, of "
                          f"WorldConfig.max_colls = {self.max_colls}; make max_colls larger")

    def fits(self, kind: str) -> bool:
        """Whether another ``kind`` has room (the same on every rank while no transfer
        was placed: every rank prepares the collectives in one order)."""
        return self.next_conn + collective(kind).connector_sets(self.nranks) \
            <= self.lowest_transfer

    def collective(self, kind: str) -> tuple[int, int]:
        sets = collective(kind).connector_sets(self.nranks)
        if self.next_conn + sets > self.lowest_transfer:
            raise self._full(f"another {kind}")
        placed = self.next_index, self.next_conn
        self.next_index += 1
        self.next_conn += sets
        return placed

    def transfer(self, sender: int, receiver: int) -> tuple[int, int]:
        n = self.nranks
        pair = sender * (n - 1) + (receiver - sender - 1) % n      # 0 .. n(n-1) - 1
        place = self.max_colls - 1 - (self.ordinals[sender, receiver] * n * (n - 1) + pair)
        if place < self.next_conn:
            raise self._full(f"another transfer from rank {sender} to rank {receiver}")
        self.ordinals[sender, receiver] += 1
        self.lowest_transfer = min(self.lowest_transfer, place)
        return place, place


_NAMES = {"kind": {v: k for k, v in KINDS.items()}, "dtype": {v: k for k, v in DTYPES.items()},
          "op": {v: k for k, v in OPS.items()}, "one_shot": {0: False, 1: True}}


def _readable(entry, field):
    value = int(entry[field])
    return _NAMES[field].get(value, value) if field in _NAMES else value


def unmatched_registrations(registered) -> list[tuple]:
    """The late registrations some ranks published and others have yet to, as (coll_id,
    kind, ranks that published, ranks to publish): the runs of such a collective wait on
    their ranks' hosts, which the daemons' state cannot show."""
    nranks = len(registered)
    found = []
    for index in range(registered.shape[1]):
        published = [r for r in range(nranks) if registered[r][index]["published"]]
        if not published:
            continue
        first = registered[published[0]][index]
        kind = _readable(first, "kind")
        peers = ({published[0], int(first["root"])} if kind in POINT_TO_POINT
                 else set(range(nranks)))
        missing = sorted(peers - set(published))
        if missing:
            found.append((int(first["coll_id"]), kind, published, missing))
    return found


def late_verdict(registered, index: int, rank: int) -> list:
    """Compare the registrations every rank published at ``index`` (``registered[r]`` is
    rank r's table of ``layout.REGISTRATION``). Returns the ranks still to publish (empty:
    confirmed); raises ValueError naming the collective, field and ranks that differ."""
    mine = registered[rank][index]
    kind = _readable(mine, "kind")
    if kind in POINT_TO_POINT:
        peers, fields = [int(mine["root"])], ("coll_id", "count", "dtype")
    else:
        peers, fields = range(len(registered)), ("coll_id", "kind", "count", "dtype", "op",
                                                 "root", "one_shot")
    missing = [r for r in peers if not registered[r][index]["published"]]
    seen = {r: registered[r][index] for r in peers if r not in missing}
    if rank not in seen:
        seen[rank] = mine
    coll_id = int(mine["coll_id"])
    for field in fields:
        values = {r: _readable(e, field) for r, e in sorted(seen.items())}
        if len(set(values.values())) > 1:
            raise _differing(coll_id, field, values)
    if kind in POINT_TO_POINT and not missing:
        (peer,) = peers
        other = registered[peer][index]
        if {kind, _readable(other, "kind")} != set(POINT_TO_POINT) or int(other["root"]) != rank:
            raise ValueError(
                f"collective {coll_id}: rank {rank} prepared a {kind} with peer {peer}, but "
                f"rank {peer} prepared a {_readable(other, 'kind')} with peer "
                f"{int(other['root'])}")
    return missing


def published_signature(entry) -> dict:
    """A ``layout.REGISTRATION`` record as the signature ``start()`` compares."""
    return {field: _readable(entry, field)
            for field in ("kind", "count", "dtype", "op", "root", "one_shot")}


def check_published(coll_id: int, sigs: dict) -> None:
    """Raise ValueError naming the field and ranks where the signatures ``sigs`` ({rank:
    signature}) of a collective prepared after ``start()`` differ: the same rules as
    ``check_signatures``, for the ranks that published so far."""
    kinds = {sig["kind"] for sig in sigs.values()}
    if kinds & set(POINT_TO_POINT):
        if len(sigs) > 1:
            _check_pair(coll_id, sigs)
        return
    first = next(iter(sigs.values()))
    for field in first:
        values = {r: sig[field] for r, sig in sorted(sigs.items())}
        if len(set(values.values())) > 1:
            raise _differing(coll_id, field, values)
