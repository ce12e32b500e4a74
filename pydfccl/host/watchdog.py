"""The watchdog: no progress anywhere for ``timeout`` seconds while work is outstanding
becomes a report (who waits on whom, the wait-for cycle) and an abort of every rank.

It reads only the control rows, which every rank can see, so each rank's watchdog reaches
the same verdict; the first one writes the report that all ranks raise.
"""

from __future__ import annotations

import faulthandler
import os
import time

import numpy as np

__all__ = ["Watchdog", "wait_for_report", "rank_status", "format_status", "silent_ranks",
           "HEARTBEAT_TIMEOUT"]

WAITS_DATA, WAITS_CREDIT = 1, 2


def rank_status(world, rank: int) -> dict:
    """What one rank's host and daemon blocks are doing, read from its control row (every
    rank can read every row). Collectives are indices in the sorted id table."""
    ctl = world.ctl
    blocks = ctl["blocks"][rank][: world.config.nblocks]
    per_block = []
    for b, blk in enumerate(blocks):
        coll = int(blk["coll"]) - 1
        word = int(blk["waits"])   # flags | the rank data comes from << 2 | credit from << 18
        waits = [(peer, what) for flag, peer, what in
                 ((WAITS_DATA, (word >> 2) & 0xFFFF, "data from"),
                  (WAITS_CREDIT, (word >> 18) & 0xFFFF, "slot credit from"))
                 if coll >= 0 and word & flag and peer != rank]
        per_block.append(dict(block=b, coll=coll if coll >= 0 else None,
                              loop=int(blk["step"]) // 1024, step=int(blk["step"]) % 1024,
                              waits=waits))
    return dict(rank=rank,
                outstanding=int(ctl["host_submitted"][rank] - ctl["host_completed"][rank]),
                host_blocked=bool(ctl["host_blocked"][rank]),
                preemptions=int(blocks["preemptions"].sum()),
                steps=int(blocks["progress"].sum()),
                blocks=per_block)


def format_status(statuses: list[dict]) -> str:
    """One line per rank: what it waits for (``Communicator.status()`` made readable)."""
    lines = []
    for st in statuses:
        parts = [f"rank {st['rank']}: {st['outstanding']} outstanding"]
        if st["host_blocked"]:
            parts.append("host in a device sync")
        for blk in st["blocks"]:
            if blk["coll"] is None:
                continue
            waits = ", ".join(f"{what} rank {peer}" for peer, what in blk["waits"])
            parts.append(f"block {blk['block']}: collective {blk['coll']} loop {blk['loop']} "
                         f"step {blk['step']}" + (f", waits for {waits}" if waits else ""))
        if "daemon" in st:
            parts.append("daemon launches: " + ", ".join(f"{k} {v}"
                                                         for k, v in st["daemon"].items()))
        lines.append("; ".join(parts))
        lines.extend("    " + entry for entry in st.get("launch_log", ()))
    return "\n".join(lines)


def wait_for_report(world, describe) -> tuple[str, list | None]:
    """Describe what every rank waits on; returns (text, cycle or None)."""
    from ..sched.model import find_wait_cycle

    statuses = [rank_status(world, r) for r in range(world.nranks)]
    running = [{b["coll"] for b in st["blocks"] if b["coll"] is not None} for st in statuses]
    lines, edges, absent = [], {}, set()
    for st in statuses:
        r = st["rank"]
        head = f"rank {r}: {st['outstanding']} outstanding"
        if st["host_blocked"]:
            head += ", host blocked in a device synchronize"
        waits = []
        for blk in st["blocks"]:
            for peer, what in blk["waits"]:
                # An edge even when the peer is on the same collective: after a full timeout
                # without progress that peer is stuck too, and the cycle may pass through it.
                doing = (", ".join(describe(c, peer) for c in sorted(running[peer]))
                         or "no collective")
                waits.append(f"{describe(blk['coll'], r)} (block {blk['block']}) waits for {what} "
                             f"rank {peer}, which is on {doing}")
                edges.setdefault(r, []).append(peer)
                if not running[peer]:
                    absent.add(peer)
        lines.append(head + (": " + "; ".join(waits) if waits else ""))
    lines.extend(_absent_line(statuses[peer]) for peer in sorted(absent))
    cycle = find_wait_cycle(edges)
    if cycle:
        lines.append("wait-for cycle: " + " -> ".join(f"rank {r}" for r in cycle + cycle[:1]))
    else:
        lines.append("no wait-for cycle among the daemons: a rank has not submitted a "
                     "collective its peers run, or its host is blocked")
    return "\n".join(lines), cycle


def _absent_line(status: dict) -> str:
    """Why a rank that its peers wait for is on no collective: the root of the stall, even
    where the waiting ranks' edges form a cycle of their own (a ring whose data and credit
    waits point both ways)."""
    r, outstanding = status["rank"], status["outstanding"]
    if outstanding:
        return (f"rank {r} is on no collective while peers wait for it, with {outstanding} "
                "outstanding: its daemon runs none of them (not launched, quit, or between "
                "tasks)")
    return (f"rank {r} is on no collective while peers wait for it, and has nothing "
            "outstanding: its host has not submitted what they run (it is behind, or blocked)")


HEARTBEAT_TIMEOUT = float(os.environ.get("PYDFCCL_HEARTBEAT_TIMEOUT", "10"))


def silent_ranks(world, timeout: float = HEARTBEAT_TIMEOUT) -> dict:
    """{rank: seconds since its host's last heartbeat} for the ranks whose host started,
    has not closed, and has been silent for ``timeout``: its process died or hangs."""
    now = time.monotonic_ns()
    beats = world.ctl["heartbeat"]
    return {r: (now - int(b)) / 1e9 for r, b in enumerate(beats)
            if b > 0 and now - int(b) > timeout * 1e9}


class Watchdog:
    def __init__(self, world, rank: int, timeout: float, describe):
        self.world = world
        self.rank = rank
        self.timeout = timeout
        self.describe = describe
        self._signature = None
        self._since = time.monotonic()
        self._next_look = 0.0

    def _progress_signature(self) -> bytes:
        blocks = self.world.ctl["blocks"][:, : self.world.config.nblocks]
        return np.concatenate([blocks["progress"].ravel(), blocks["completed"].ravel()]).tobytes()

    def check(self) -> str | None:
        """Called while this rank has outstanding work or its host is blocked in a device
        synchronize; a report once nothing has moved anywhere for ``timeout``."""
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + min(0.05, self.timeout / 10)
        silent = silent_ranks(self.world)
        if silent:      # a peer's host is gone: waiting for the stall timeout helps no one
            names = ", ".join(f"rank {r} (no heartbeat for {s:.1f} s)" for r, s in silent.items())
            return self.world.abort_with(f"rank failure: {names}: its process died or "
                                         f"hangs (seen by rank {self.rank})")
        signature = self._progress_signature()
        if signature != self._signature:
            self._signature, self._since = signature, now
            return None
        if now - self._since < self.timeout:
            return None
        text, _ = wait_for_report(self.world, self.describe)
        if os.environ.get("PYDFCCL_DEADLOCK_STACKS") == "1":
            # "its host is blocked": where each thread of this process stands (every rank's,
            # with ranks as threads), before the abort moves them
            faulthandler.dump_traceback(all_threads=True)
        return self.world.abort_with(f"deadlock: no progress on any rank for "
                                     f"{self.timeout:.1f} s (seen by rank {self.rank})\n{text}")
