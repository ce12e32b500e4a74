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

This module is the study's front: every public name, and ``main`` for ``python -m pydfccl
risk``. The pieces: :mod:`~pydfccl.sched.risk_rounds` (topology, template, rounds),
:mod:`~pydfccl.sched.risk_search` (the search and the plain simulation),
:mod:`~pydfccl.sched.risk_estimate` (the study over a grid, CSV, plot) and
:mod:`~pydfccl.sched.risk_cli` (the command line).
"""

from __future__ import annotations

import sys

from .risk_cli import main
from .risk_estimate import RiskRow, plot, risk_study, wilson_interval, write_csv
from .risk_rounds import PRESETS, Round, Topology, make_round, sample_round
from .risk_search import find_deadlock, simulate_round

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

if __name__ == "__main__":
    sys.exit(main())
