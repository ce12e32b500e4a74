"""How long a run may go without progress before the model calls it a livelock, derived
from the policy's own functions."""

from __future__ import annotations

from functools import lru_cache

__all__ = ["quits_ever", "longest_pass", "default_quiet_ticks"]


@lru_cache(maxsize=256)
def quits_ever(should_quit, params):
    """Whether ``should_quit`` ever says yes (checked on 1..4096 and every power of two)."""
    probes = list(range(1, 4097)) + [1 << k for k in range(13, 63)]
    return any(should_quit(params, k) for k in probes)


def longest_pass(threshold_on_load, tries_per_pass, params, priorities):
    """Ticks a daemon can spin through one pass over tasks of ``priorities`` (one each)
    without progress, and the longest budget that allows for: it asks ``should_quit`` only
    between passes, and a long head budget (dfccl's HEAD_BASE) makes a pass outlast
    QUIT_AFTER many times over (HEAD_BASE 500 and NUM_TRY 5 spin 7,500 ticks on the head
    alone). Budgets are taken with the policy word at 0, as a run starts; the model widens
    its window when a word makes one longer."""
    kinds = sorted(set(priorities)) or [0]

    def budget(is_head):
        return max(threshold_on_load(params, is_head, t, prio, 0)
                   for t in range(1, 65) for prio in kinds)

    def spins(is_head):
        return max(max(1, tries_per_pass(params, is_head, prio)) for prio in kinds) * \
            budget(is_head)
    return spins(1) + (len(priorities) - 1) * spins(0), max(budget(1), budget(0))


def default_quiet_ticks(should_quit, params, nranks, quits, pass_ticks):
    """Ticks without progress after which a schedule counts as livelocked.

    A daemon without progress quits after Q spins (the first power of two where
    ``should_quit`` says yes) once its pass is over (``pass_ticks``, the longest pass, at
    most); other daemons may quit and relaunch meanwhile, so allow
    64 * nranks * max(Q, pass_ticks). A policy that never quits (``quits`` false) gets a
    million ticks.
    """
    if not quits:
        return 1_000_000
    k = 1
    while not should_quit(params, k) and k < 1 << 62:
        k *= 2
    return 64 * nranks * max(k, pass_ticks) + 10_000
