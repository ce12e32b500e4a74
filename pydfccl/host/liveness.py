"""Whether a peer's host is alive, told by its process rather than by a Python thread.

Every rank of a world shares its control rows, so every rank runs on one host: a rank
writes its pid (with the process's start time, so that a reused pid is not taken for it,
and its pid namespace) into its row when it starts, and a peer whose process is gone is
known at once and exactly. A heartbeat written by a Python thread cannot tell a dead
process from a live one that holds the GIL in one long C call (a big pickle, a checkpoint),
so it is kept only for peers whose pid means nothing here (another pid namespace, or
another node, whose replica row ``pydfccl.transport.rows`` stamps with the time its last
copy arrived), with a timeout (``PYDFCCL_HEARTBEAT_TIMEOUT``, 300 s) far longer than any such call.

A rank that closes on purpose sets its heartbeat to -1: it is not dead, but its daemon runs
no more collectives (``closed_peers``).
"""

from __future__ import annotations

import os
import time

__all__ = ["HEARTBEAT_TIMEOUT", "REMOTE_NS", "this_process", "register", "process_alive",
           "dead_peers", "closed_peers", "describe_dead"]

HEARTBEAT_TIMEOUT = float(os.environ.get("PYDFCCL_HEARTBEAT_TIMEOUT", "300"))
REMOTE_NS = -1   # the pid namespace of a rank on another node (its row is a replica)


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), or None
    where there is no /proc; -1 once it is gone or a zombie (dead, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return -1
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):
        return -1
    return int(fields[19])


def _pid_namespace() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def this_process() -> tuple[int, int, int]:
    """(pid, start ticks or 0, pid namespace) of the calling process."""
    pid = os.getpid()
    return pid, _start_ticks(pid) or 0, _pid_namespace()


def register(row) -> None:
    """Write the calling process into ``row`` (a one-row slice of the control rows)."""
    row["pid"], row["pid_start"], row["pid_ns"] = this_process()


def process_alive(pid: int, start: int) -> bool:
    """Whether process ``pid`` (started at ``start`` ticks; 0 if unknown) still runs."""
    ticks = _start_ticks(pid)
    if ticks is None:            # no /proc: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return ticks != -1 and (not start or ticks == start)


def dead_peers(world, me: int) -> dict:
    """{rank: why} for the peers of rank ``me`` that started, did not close, and whose host
    process is gone (or, in another pid namespace, silent for HEARTBEAT_TIMEOUT)."""
    ctl = world.ctl
    my_ns = int(ctl["pid_ns"][me])
    now = time.monotonic_ns()
    dead = {}
    for r in range(world.nranks):
        beat, pid = int(ctl["heartbeat"][r]), int(ctl["pid"][r])
        if r == me or beat <= 0 or pid <= 0:
            continue
        if int(ctl["pid_ns"][r]) == my_ns:
            if not process_alive(pid, int(ctl["pid_start"][r])):
                dead[r] = f"its process (pid {pid}) ended without closing its communicator"
        elif now - beat > HEARTBEAT_TIMEOUT * 1e9:
            where = ("on another node: nothing from its network proxy"
                     if int(ctl["pid_ns"][r]) == REMOTE_NS else "in another pid namespace")
            dead[r] = f"no heartbeat for {(now - beat) / 1e9:.0f} s (pid {pid} {where})"
    return dead


def closed_peers(world, me: int) -> dict:
    """{rank: collectives it left outstanding} for the peers that closed their
    communicator."""
    ctl = world.ctl
    return {r: int(ctl["host_submitted"][r] - ctl["host_completed"][r])
            for r in range(world.nranks) if r != me and int(ctl["heartbeat"][r]) == -1}


def describe_dead(dead: dict) -> str:
    return "; ".join(f"rank {r}: {why}" for r, why in sorted(dead.items()))
