"""Every collective kind, defined once: its code, its steps, its buffers, its connectors and
what it must produce. The rest of the package derives what it needs from this table:
``codes.KINDS`` and the kind lists, the registry's connector sets (``host.registration``),
a collective's channels (``kernels.ring.channel_count``), its buffer sizes and expected
output (``reference``), the model's ring width (``sched.steps``). The daemon's step plans
(``kernels/plans.py``: which primitive each step is, with which peers) are device code that
switches on the codes given here; a test checks that their steps per loop are these.

Counts follow NCCL: all_gather's ``count`` is the per-rank input, reduce_scatter's the
per-rank output, all_to_all's the elements each rank sends to each rank. all_to_allv's
``count`` is the most any rank sends to any one rank in a run; each run gives its own
per-peer counts (``send_counts``, ``recv_counts``), and its buffers hold exactly those
elements, packed in rank order as MPI_Alltoallv's with displacements that are the running
sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Collective", "COLLECTIVES", "BY_NAME", "BY_CODE", "ONE_SHOT", "ONE_SHOT_STEPS",
           "LOOP_COUNTED", "collective", "split_output"]


@dataclass(frozen=True)
class Collective:
    """One kind of collective.

    ``steps(n)``: steps of one loop on n ranks (each a primitive and a preemption point).
    ``buffers(count, n)``: (send, recv) elements of a run. ``output(inputs, rank, root,
    reduced)``: rank's expected output from every rank's send buffer, ``reduced()`` giving
    the elementwise reduction in the engine's order (None: no output, or one NCCL leaves
    unspecified; a kind with ``per_peer_counts`` has ``split_output`` instead).
    ``buffers`` of such a kind: the most a run may take. ``connector_sets(n)``: connector
    sets a collective takes in the pool."""

    name: str
    code: int                         # the daemon's table records it (``COLL_ENTRY.kind``)
    steps: Callable[[int], int]
    buffers: Callable[[int, int], tuple]
    output: Callable | None
    connector_sets: Callable[[int], int] = lambda n: 1
    ring_loop: bool = False           # a loop covers a slot per rank (n chunks), not one slot
    point_to_point: bool = False      # prepared on two ranks only, with peer= (kept in root)
    out_of_place_only: bool = False   # needs a recv buffer apart from the send buffer
    loop_counted: bool = False        # its slot counters count loops (it sends and receives
    #                                   once a loop on each of its connector sets), not steps
    per_peer_counts: bool = False     # each run gives how much goes to and comes from each
    #                                   rank (``send_counts``, ``recv_counts``)


def _same(count, n):
    return count, count


def _copy_of_root(inputs, rank, root, reduced):
    return inputs[root].copy()


def _to_all(inputs, rank, root, reduced):
    """Block j of the output is block ``rank`` of rank j's input."""
    count = inputs[0].size // len(inputs)
    return np.concatenate([x[rank * count:(rank + 1) * count] for x in inputs])


def _own_block(inputs, rank, root, reduced):
    total = reduced()
    count = total.size // len(inputs)
    return total[rank * count:(rank + 1) * count]


COLLECTIVES = (
    Collective("all_reduce", 0, steps=lambda n: 2 * n - 1, buffers=_same,
               output=lambda inputs, rank, root, reduced: reduced(),
               ring_loop=True),
    Collective("all_gather", 1, steps=lambda n: n, buffers=lambda count, n: (count, n * count),
               output=lambda inputs, rank, root, reduced: np.concatenate(inputs),
               out_of_place_only=True),
    Collective("reduce_scatter", 2, steps=lambda n: n,
               buffers=lambda count, n: (n * count, count), output=_own_block,
               out_of_place_only=True),
    Collective("broadcast", 3, steps=lambda n: 1, buffers=_same, output=_copy_of_root),
    Collective("reduce", 4, steps=lambda n: 1, buffers=_same,
               output=lambda inputs, rank, root, reduced: reduced() if rank == root else None),
    Collective("send", 5, steps=lambda n: 1, buffers=_same,
               output=lambda inputs, rank, root, reduced: None, point_to_point=True),
    Collective("recv", 6, steps=lambda n: 1, buffers=_same, output=_copy_of_root,
               point_to_point=True),
    Collective("all_to_all", 7, steps=lambda n: 2 * n - 1,
               buffers=lambda count, n: (n * count, n * count), output=_to_all,
               connector_sets=lambda n: max(1, n - 1), out_of_place_only=True,
               loop_counted=True),
    # all_to_all's steps and connectors; a step moves the part of its peer's block that the
    # run's counts leave in the loop (none past the count: an empty slot keeps the pair in
    # step), so the loops are those of ``count`` on every rank.
    Collective("all_to_allv", 8, steps=lambda n: 2 * n - 1,
               buffers=lambda count, n: (n * count, n * count), output=None,
               connector_sets=lambda n: max(1, n - 1), out_of_place_only=True,
               loop_counted=True, per_peer_counts=True),
)
BY_NAME = {c.name: c for c in COLLECTIVES}
BY_CODE = {c.code: c for c in COLLECTIVES}
# A small all_reduce runs one-shot (kernels/plans.py): a kind of the daemon's alone, after
# the users' kinds, in two steps (send to every rank; receive and reduce every rank's).
ONE_SHOT = max(BY_CODE) + 1
ONE_SHOT_STEPS = 2
# The daemon's kinds whose slot counters count loops (``post_step``).
LOOP_COUNTED = tuple(c.code for c in COLLECTIVES if c.loop_counted)


def split_output(inputs, counts, rank: int) -> np.ndarray:
    """Rank ``rank``'s output of an all_to_allv: from each rank j in turn, the
    ``counts[j][rank]`` elements of ``inputs[j]`` it sends to ``rank`` (``counts[j]``:
    rank j's send counts; its blocks packed in rank order)."""
    parts = []
    for x, sent in zip(inputs, counts):
        start = int(sum(sent[:rank]))
        parts.append(np.asarray(x)[start:start + int(sent[rank])])
    return np.concatenate(parts) if parts else np.empty(0)


def collective(name: str) -> Collective:
    """The definition of kind ``name``; ValueError naming the kinds if there is none."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown collective kind {name!r}; supported: {sorted(BY_NAME)}"
                         ) from None
