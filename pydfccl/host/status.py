"""What ``Communicator.stats()`` and ``status()`` show of a rank: counters, and live status
of every rank read from the control rows, with the collectives named by coll_id."""

from __future__ import annotations

from .watchdog import rank_status

__all__ = ["rank_stats", "world_status"]


def rank_stats(world, rank: int, submissions, cq, launcher, policy_name: str,
               shared=None) -> dict:
    """Counters of rank ``rank``: its runs, its daemon blocks' preemptions, quits and steps,
    the launches of its daemon (none before ``start``: ``launcher`` None), and the slots
    its collectives share (``shared``: ``shared_slots.SharedSlots``, None when none)."""
    blocks = world.ctl["blocks"][rank][: world.config.nblocks]
    launches = launcher.launches if launcher is not None else 0
    return dict(
        rank=rank,
        submitted=submissions.submitted,
        completed=cq.completed,
        preemptions=int(blocks["preemptions"].sum()),
        launches=launches,
        relaunches=max(0, launches - 1),
        quits=int(blocks["exits"].min()) if len(blocks) else 0,
        steps=int(blocks["progress"].sum()),
        dropped_buffers=cq.dropped_buffers,
        policy=policy_name,
        device_bytes=world.config.pool_bytes,     # this rank's pool
        pinned_bytes=world.config.ctl_bytes,      # the world's control rows
        shared_slots=0 if shared is None else shared.nslots - shared.first,
    )


def world_status(world, rank: int, by_index: dict, submissions, launcher, lock) -> list[dict]:
    """``watchdog.rank_status`` of every rank, collectives named by coll_id (``by_index``);
    rank ``rank``'s entry also lists its collectives ``in_flight``, the runs ``queued``
    behind them, the runs ``waiting`` for a shared slot (by coll_id), and its host's view of the ``daemon`` launches and their ``launch_log``."""
    out = []
    for r in range(world.nranks):
        st = rank_status(world, r)
        for blk in st["blocks"]:
            if blk["coll"] is not None:
                blk["coll"] = by_index.get(blk["coll"], blk["coll"])
        out.append(st)
    with lock:    # this rank's host also knows which collectives it waits for
        mine = out[rank]
        mine["in_flight"] = sorted(by_index[i] for i in submissions.in_flight_indices())
        mine["queued"] = {by_index[i]: n for i, n in submissions.queued_counts().items()}
        mine["waiting"] = {cid: len(q) for cid, q in submissions.waiting.items() if q}
        mine["daemon"] = launcher.view()
        mine["launch_log"] = launcher.log()
    return out
