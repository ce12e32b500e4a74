"""The collectives one rank registered, and where each lives in its daemon's table.

``prepare`` checks its arguments here and records a ``CollSpec``; ``start`` (and a late
registration) gives each collective its index in the daemon's collective table and writes
the table's record of it. Reports name collectives through the catalog too: the daemon and
the control rows know them only by index.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..protocol.one_shot import table_kind
from ..kernels.ring import channel_count
from ..protocol import layout as L
from ..protocol.codes import (OUT_OF_PLACE_ONLY, PER_PEER_COUNTS, POINT_TO_POINT, dtype_code,
                              kind_code, normalize_dtype, op_code)
from ..protocol.collectives import ONE_SHOT, collective
from ..protocol.reference import buffer_elems
from .arguments import require_int

__all__ = ["CollSpec", "Catalog", "MAX_BUFFER_BYTES", "PRIORITY_LIMIT"]

# A buffer's bytes, at most: far beyond any device's memory, and every offset the daemon
# computes from it (up to nranks times it) stays within its 64-bit words.
MAX_BUFFER_BYTES = 1 << 48
# |priority| at most: the policies shift it left by up to 40 bits into a 64-bit sort key.
PRIORITY_LIMIT = 1 << 20


@dataclass(frozen=True)
class CollSpec:
    """What ``prepare`` registered; compared field by field across ranks at ``start``."""

    coll_id: int
    kind: str
    count: int
    dtype: str
    op: str
    root: int
    priority: int

    def sizes(self, nranks: int) -> tuple[int, int]:
        """Elements the send and recv buffers need (NCCL's conventions for ``count``)."""
        return buffer_elems(self.kind, self.count, nranks)

    @property
    def in_place_ok(self) -> bool:
        return self.kind not in OUT_OF_PLACE_ONLY

    @property
    def per_peer_counts(self) -> bool:
        """Whether each run gives its own counts per peer (an all_to_allv)."""
        return self.kind in PER_PEER_COUNTS

    def signature(self) -> dict:
        """The fields that must agree across ranks (priority is a per-rank preference)."""
        return dict(kind=self.kind, count=self.count, dtype=self.dtype, op=self.op,
                    root=self.root)


class Catalog:
    """One rank's registrations (``specs``, by coll_id), each one's table index (``index``)
    and, for every rank's collectives, the coll_id at an index (``by_index``). The dicts
    are only ever changed in place: the trace reader and the communicator hold them."""

    def __init__(self, config, rank: int, nranks: int):
        self.config, self.rank, self.nranks = config, rank, nranks
        self.specs: dict[int, CollSpec] = {}
        self.index: dict[int, int] = {}
        self.by_index: dict[int, int] = {}

    def new_spec(self, coll_id, kind: str, count, dtype, op: str, root: int, priority: int,
                 peer) -> CollSpec:
        """The spec ``prepare`` describes, or ValueError (TypeError for an argument of the
        wrong type) naming what is wrong with it."""
        coll_id = require_int("coll_id", coll_id, minimum=0)
        if coll_id in self.specs:
            raise ValueError(f"collective {coll_id} is already prepared")
        kind_code(kind)
        op_code(op)
        dt = normalize_dtype(dtype)
        where = f"collective {coll_id}: "
        count = require_int("count", count, minimum=0, where=where)
        largest = max(buffer_elems(kind, count, self.nranks)) * dt.itemsize
        if largest > MAX_BUFFER_BYTES:
            raise ValueError(f"{where}count {count} is too large: its {kind} needs a buffer "
                             f"of {largest} bytes, more than the {MAX_BUFFER_BYTES} "
                             "(2**48) pydfccl can address")
        root = require_int("root", root, where=where)
        priority = require_int("priority", priority, minimum=-PRIORITY_LIMIT,
                               maximum=PRIORITY_LIMIT, where=where)
        if peer is not None:
            peer = require_int("peer", peer, where=where)
        if not 0 <= root < self.nranks:
            raise ValueError(f"collective {coll_id}: root {root} out of range 0..{self.nranks - 1}")
        if kind in POINT_TO_POINT:
            if peer is None or not 0 <= peer < self.nranks or peer == self.rank:
                raise ValueError(f"collective {coll_id}: a {kind} needs peer= another rank "
                                 f"(0..{self.nranks - 1}, not {self.rank}), got {peer!r}")
            root = peer     # the daemon finds a transfer's peer where a chain keeps its root
        elif peer is not None:
            raise ValueError(f"collective {coll_id}: peer= is for send and recv, not {kind}")
        return CollSpec(int(coll_id), kind, int(count), dt.name, op, int(root), int(priority))

    def daemon_kind(self, spec: CollSpec) -> int:
        """The kind the daemon's table records (``plans.ONE_SHOT`` for a small all_reduce)."""
        return table_kind(spec.kind, spec.count, np.dtype(spec.dtype).itemsize, self.nranks,
                          self.config.slot_bytes)

    def signature(self, spec: CollSpec) -> dict:
        """What must agree across ranks: the spec's fields, and whether it runs one-shot,
        which a rank's PYDFCCL_ONE_SHOT_BYTES also decides (ranks that disagree would wait
        on different counters)."""
        return dict(spec.signature(), one_shot=self.daemon_kind(spec) == ONE_SHOT)

    def signatures(self) -> dict:
        """{coll_id: signature} of every registration, for ``start``'s exchange."""
        return {cid: self.signature(spec) for cid, spec in self.specs.items()}

    def table_entry(self, spec: CollSpec, conn: int) -> tuple:
        """The daemon's collective-table record of ``spec`` using connector sets from
        ``conn`` on."""
        itemsize = np.dtype(spec.dtype).itemsize
        nchannels = channel_count(collective(spec.kind).ring_loop, spec.count, itemsize,
                                  self.nranks, self.config.nblocks, self.config.slot_bytes)
        return (self.daemon_kind(spec), dtype_code(spec.dtype), op_code(spec.op), spec.count,
                spec.root, nchannels, itemsize, conn)

    def place_all(self, index: dict, conn: dict) -> np.ndarray:
        """Record ``start``'s placement (``index`` and ``conn`` by coll_id, every rank's
        collectives) and return the daemon's table of this rank's."""
        table = np.zeros(L.MAX_COLLS, L.COLL_ENTRY)
        for coll_id, spec in self.specs.items():
            self.index[coll_id] = index[coll_id]
            table[index[coll_id]] = self.table_entry(spec, conn[coll_id])
        self.by_index.update({i: c for c, i in index.items()})    # every rank's, for reports
        return table

    def place(self, coll_id: int, index: int) -> None:
        """Record a late registration's place (the caller holds the communicator's lock)."""
        self.index[coll_id] = index
        self.by_index[index] = coll_id

    def describe(self, index: int, rank: int | None = None) -> str:
        """The collective at table ``index`` as ``rank`` (default: this one) runs it."""
        if index not in self.by_index:
            return f"collective #{index}"
        coll_id = self.by_index[index]
        spec = self.specs.get(coll_id)      # None: another rank's point-to-point transfer
        if spec is None:
            return f"collective {coll_id}"
        kind = spec.kind
        if kind in POINT_TO_POINT and rank not in (None, self.rank):
            kind = "recv" if kind == "send" else "send"     # the other end of the transfer
        return f"{kind} {coll_id}"

    def spec_at(self, index: int) -> CollSpec:
        """This rank's spec at table ``index``."""
        return self.specs[self.by_index[index]]
