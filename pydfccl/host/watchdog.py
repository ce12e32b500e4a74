"""The watchdog: a dead or closed peer, a proven deadlock, or a stall past the user's
timeout becomes a report (who waits on whom, the wait-for cycle) and an abort of every
rank; a stall that may still end (a late peer) is only reported.

It reads only the control rows, which every rank can see, so each rank's watchdog reaches
the same verdict; the first one writes the report that all ranks raise.
"""

from __future__ import annotations

import faulthandler
import os
import time

import numpy as np

from ..log import logger
from ..protocol.layout import FAULT_RANK, unpack_step
from . import liveness
from .registration import unmatched_registrations

__all__ = ["Watchdog", "wait_for_report", "rank_status", "format_status", "DEFAULT_TIMEOUT"]

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
        loop, step = unpack_step(int(blk["step"]))
        per_block.append(dict(block=b, coll=coll if coll >= 0 else None, loop=loop, step=step,
                              waits=waits))
    return dict(rank=rank,
                outstanding=int(ctl["host_submitted"][rank] - ctl["host_completed"][rank]),
                host_blocked=bool(ctl["host_blocked"][rank]),
                preemptions=int(blocks["preemptions"].sum()),
                steps=int(blocks["progress"].sum()),
                blocks=per_block)


def format_status(statuses: list[dict], internals: bool = True) -> str:
    """One line per rank of ``Communicator.status()`` in a user's words: runs outstanding,
    preemptions, the host in a device sync, the collective each daemon block is on and whom
    it waits for. ``internals``: also each block's loop, and the launcher's state and last
    changes (a line each, indented), for a report on a stall."""
    lines = []
    for st in statuses:
        parts = [f"rank {st['rank']}: {st['outstanding']} outstanding",
                 f"{st['preemptions']} preemptions"]
        if st["host_blocked"]:
            parts.append("host in a device sync")
        for blk in st["blocks"]:
            if blk["coll"] is None:
                continue
            where = (f"loop {blk['loop']}, " if internals else "") + f"step {blk['step']}"
            waits = ", ".join(f"{what} rank {peer}" for peer, what in blk["waits"])
            parts.append(f"block {blk['block']} on collective {blk['coll']} ({where})"
                         + (f", waiting for {waits}" if waits else ""))
        if len(parts) == 2 and not st["outstanding"]:
            parts.append("idle")
        if internals and "daemon" in st:
            parts.append("daemon launches: " + ", ".join(f"{k} {v}"
                                                         for k, v in st["daemon"].items()))
        lines.append("; ".join(parts))
        if internals:
            lines.extend("    " + entry for entry in st.get("launch_log", ()))
    return "\n".join(lines)


def wait_for_report(world, describe, with_absent: bool = False):
    """Describe what every rank waits on; returns (text, cycle or None), and with
    ``with_absent`` the ranks waited for that are on no collective."""
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
    lines.extend(f"collective {coll_id} ({kind}), prepared after start() on ranks {have}, is "
                 f"not yet prepared on ranks {missing}: its runs wait on the hosts until it is"
                 for coll_id, kind, have, missing in unmatched_registrations(
                     world.ctl["registered"]))
    lines.extend(_absent_line(statuses[peer]) for peer in sorted(absent))
    cycle = find_wait_cycle(edges)
    if cycle:
        lines.append("wait-for cycle: " + " -> ".join(f"rank {r}" for r in cycle + cycle[:1]))
    else:
        lines.append("no wait-for cycle among the daemons: a rank has not submitted a "
                     "collective its peers run, or its host is blocked")
    if with_absent:
        return "\n".join(lines), cycle, absent
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


DEFAULT_TIMEOUT = float(os.environ.get("PYDFCCL_TIMEOUT", "600"))   # torch's 10 minutes
# A daemon publishes what it waits for only when a wait lasts, and does not clear it when
# the wait ends: a wait on a closed peer is believed once nothing has moved for this long.
CLOSED_PEER_GRACE = 2.0


class Watchdog:
    """Rank ``rank``'s view of the job's liveness and progress, looked at while the rank
    waits (``check``). What it does, and when:

    - a peer whose process is gone, or that closed its communicator while this rank's
      daemon waits for it: abort every rank at once, naming it (``host.liveness``);
    - no progress on any rank for ``timeout`` (``watchdog_timeout``): a report of who
      waits on whom, logged once per stall. Under a policy whose daemons never preempt
      (``proves_deadlock``) a wait-for cycle among ranks that are all inside collectives,
      or a host blocked in a device synchronize behind a daemon that never quits
      (``never_quits``), is a proven deadlock: abort at once;
    - otherwise a peer is late, not deadlocked (under dfccl it may still submit): abort
      only once nothing has moved for ``abort_after`` (the user's timeout, 600 s by
      default, as torch's).
    """

    def __init__(self, world, rank: int, timeout: float, describe,
                 abort_after: float | None = None, proves_deadlock: bool = True,
                 never_quits: bool = False):
        self.world = world
        self.rank = rank
        self.timeout = timeout
        self.abort_after = max(timeout, DEFAULT_TIMEOUT if abort_after is None
                               else abort_after)
        self.describe = describe
        self.proves_deadlock = proves_deadlock
        self.never_quits = never_quits
        self._signature = None
        self._since = time.monotonic()
        self._next_look = 0.0
        self._reported = False

    def _progress_signature(self) -> bytes:
        blocks = self.world.ctl["blocks"][:, : self.world.config.nblocks]
        return np.concatenate([blocks["progress"].ravel(), blocks["completed"].ravel()]).tobytes()

    def _split_fault(self) -> str | None:
        """A pair of ranks whose counts of an all_to_allv differ, as this rank's daemon
        found it (the length a slot carries is not the one this rank expects)."""
        word = int(self.world.ctl["blocks"]["fault"][self.rank].max())
        if not word:
            return None
        index, sender = word % FAULT_RANK - 1, word // FAULT_RANK
        return (f"bad counts: {self.describe(index)}: rank {sender} sends rank {self.rank} "
                f"another number of elements than rank {self.rank}'s recv_counts[{sender}] "
                "(what rank a sends rank b must be what b receives from a)")

    def check(self) -> str | None:
        """Called while this rank has outstanding work or its host is blocked in a device
        synchronize; the abort report in force once this rank must fail, else None."""
        now = time.monotonic()
        if now < self._next_look:
            return None
        self._next_look = now + min(0.05, self.timeout / 10)
        fault = self._split_fault()
        if fault:
            return self.world.abort_with(fault)
        dead = liveness.dead_peers(self.world, self.rank)
        if dead:        # a peer's host is gone: waiting for it helps no one
            return self.world.abort_with(f"rank failure: {liveness.describe_dead(dead)} "
                                         f"(seen by rank {self.rank})")
        signature = self._progress_signature()
        moved = signature != self._signature
        if moved:
            self._signature, self._since, self._reported = signature, now, False
        if moved:
            return None
        stalled = now - self._since
        closed = self._waited_on_closed() if stalled >= CLOSED_PEER_GRACE else None
        if closed:
            return self.world.abort_with(closed)
        if stalled < self.timeout:
            return None
        text, cycle, absent = wait_for_report(self.world, self.describe, with_absent=True)
        proven = self._proven(cycle, absent)
        if proven is None and stalled < self.abort_after:
            if not self._reported:
                self._reported = True
                logger.warning("rank %d: no progress on any rank for %.0f s; a peer is late "
                               "(it fails at the timeout, %.0f s):\n%s", self.rank, stalled,
                               self.abort_after, text)
            return None
        if os.environ.get("PYDFCCL_DEADLOCK_STACKS") == "1":
            # "its host is blocked": where each thread of this process stands (every rank's,
            # with ranks as threads), before the abort moves them
            faulthandler.dump_traceback(all_threads=True)
        if proven is None:
            return self.world.abort_with(
                f"timeout: no progress on any rank for {stalled:.0f} s, the timeout (seen by "
                f"rank {self.rank})\n{text}")
        return self.world.abort_with(f"deadlock: {proven}: no progress on any rank for "
                                     f"{stalled:.1f} s (seen by rank {self.rank})\n{text}")

    def _proven(self, cycle, absent) -> str | None:
        """Why the stall can never end by itself, or None (a peer may be late)."""
        if not self.proves_deadlock:
            return None
        if cycle and not absent:
            return "a wait-for cycle among daemons that never preempt"
        if self.never_quits and self.world.ctl["host_blocked"].any():
            return "a host blocked in a device synchronize behind daemons that never quit"
        return None

    def _waited_on_closed(self) -> str | None:
        """A report if, with no progress anywhere for CLOSED_PEER_GRACE, a rank's daemon
        waits for a peer that closed its communicator (its daemon runs nothing any more).
        A peer that closed with runs of its own outstanding aborted every rank itself."""
        closed = liveness.closed_peers(self.world, self.rank)
        if not closed:
            return None
        for st in (rank_status(self.world, r) for r in range(self.world.nranks)):
            for blk in st["blocks"]:
                for peer, what in blk["waits"]:
                    if peer in closed:
                        left = closed[peer]
                        return (f"rank {peer} closed its communicator ({left} of its runs "
                                f"outstanding) while rank {st['rank']}'s "
                                f"{self.describe(blk['coll'], st['rank'])} waits for {what} "
                                f"it (seen by rank {self.rank})")
        return None
