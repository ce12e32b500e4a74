"""The narration of ``python -m pydfccl teach``: a thread in each rank that tells what its
daemon does as it happens, from the daemon's own event log (``comm.trace()``), and, in the
lead rank, the wait-for graph whenever it changes and a line of progress while nothing
moves (the watchdog's wait, which would otherwise be silence)."""

from __future__ import annotations

import sys
import threading
import time

from ..sched.wait_graph import find_wait_cycle

__all__ = ["Narrator", "wait_edges", "format_graph"]

POLL = 0.05           # seconds between looks at the event log and the status
QUIET = 1.0           # seconds without progress before a progress line


def wait_edges(statuses: list[dict], names: dict) -> list[tuple]:
    """(rank, peer it waits for, collective's label) of the waiting daemon blocks, as
    ``comm.status()`` shows them, sorted: a rank's waits for data, or where it has none,
    its waits for room in a peer's buffer (slot credit, the data waits' mirror image), so
    that the graph shows the ring's cycle the watchdog reports."""
    edges, credit = set(), set()
    for st in statuses:
        for blk in st["blocks"]:
            for peer, what in blk["waits"]:
                edge = (st["rank"], peer, names.get(blk["coll"], str(blk["coll"])))
                (edges if what.startswith("data") else credit).add(edge)
    waiting = {a for a, _, _ in edges}
    return sorted(edges | {e for e in credit if e[0] not in waiting})


def format_graph(edges: list[tuple]) -> str:
    """``rank 0 -> rank 1 (in all_reduce 0), ...: a cycle: ...``, or nobody waits."""
    if not edges:
        return "wait-for graph: nobody waits"
    text = ", ".join(f"rank {a} -> rank {b} (in {label})" for a, b, label in edges)
    cycle = find_wait_cycle({a: [b for x, b, _ in edges if x == a] for a, _, _ in edges})
    if cycle:
        ring = " -> ".join(f"rank {r}" for r in cycle + cycle[:1])
        text += f"; a cycle: {ring}"
    return "wait-for graph: " + text


_SAYING = threading.Lock()


class Narrator:
    """Prints one rank's daemon events as sentences while the rank's program runs
    (``start``/``stop``); the ``lead`` rank also prints the wait-for graph when it changes
    and progress lines while nothing moves. ``started`` is the lesson's start (time.time()),
    so that every rank's lines carry the same clock; ``baseline``: a kernel per collective,
    not a daemon."""

    def __init__(self, comm, names: dict, started: float, lead: bool, watchdog: float,
                 baseline: bool, out=None):
        from .. import platform     # in a rank: the command's own process may not load Numba

        self.comm, self.names, self.lead = comm, names, lead
        self.watchdog, self.baseline = watchdog, baseline
        self.out = out or sys.stdout
        self.started = started
        # the daemon's clock against this host's wall clock (the simulator's is the host's
        # own monotonic clock; a GPU's %globaltimer is within a millisecond of it)
        self._clock = (platform.event_clock_ns(), time.time())
        self._seen = 0
        self._launches = 0
        self._quits = 0
        self._preempted: dict = {}      # coll -> step it was preempted at
        self._repeat = None             # [coll, step, budgets]: preemptions folded into one
        self._graph = None
        self._candidate = None
        self.graphs: list = []          # every wait-for graph printed, in order
        self._progress = (None, time.monotonic(), 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"pydfccl-teach-r{comm.rank}")

    # -- lines --------------------------------------------------------------------------------

    def say(self, text: str, at: float | None = None) -> None:
        """One line, stamped with ms since the lesson started (``at``: a time.time())."""
        ms = 1e3 * ((time.time() if at is None else at) - self.started)
        with _SAYING:      # one write a line: two ranks' lines never share one
            self.out.write(f"  {ms:8.0f} ms  {text}\n")
            self.out.flush()

    def _when(self, t_ns: int) -> float:
        ev0, wall0 = self._clock
        return wall0 + (t_ns - ev0) / 1e9

    def _label(self, coll) -> str:
        return self.names.get(coll, f"collective {coll}")

    def _flush_repeat(self) -> None:
        if self._repeat is None:
            return
        coll, step, budgets, at = self._repeat
        self._repeat = None
        if budgets:
            shown = ", ".join(f"{b:.3g}" for b in budgets)
            self.say(f"rank {self.comm.rank} daemon: ...tried {self._label(coll)} again "
                     f"{len(budgets)} more time(s) at step {step}, preempted each time "
                     f"(budgets {shown} ms)", at)

    def _event(self, e: dict) -> None:
        r, what, coll = self.comm.rank, e["event"], e["coll"]
        at = self._when(e["t_ns"])
        who = f"rank {r} {'kernel' if self.baseline else 'daemon'}"
        if what == "preempted":
            budget = e.get("waited_ns", 0) / 1e6
            rep = self._repeat
            if rep is not None and rep[0] == coll and rep[1] == e["step"]:
                rep[2].append(budget)
                rep[3] = at
                return
            self._flush_repeat()
            self._preempted[coll] = e["step"]
            self.say(f"{who}: {self._label(coll)} waited its whole budget ({budget:.3g} ms) "
                     f"in {e.get('primitive', 'a primitive')} at step {e['step']}: "
                     "preempted, its context saved", at)
            self._repeat = [coll, e["step"], [], at]
            return
        if what == "loaded" and self._repeat is not None and self._repeat[0] == coll:
            return          # a resume of the collective whose preemptions are folded
        if what in ("launched", "quit") and e["block"] != 0:
            return          # every block logs the launch and the quit: one line a launch
        self._flush_repeat()
        if what == "launched":
            self._launches += 1
            if self.baseline:
                self.say(f"{who}: a kernel launched for the collective just submitted", at)
            else:
                self.say(f"{who}: " + ("launched" if self._launches == 1 else
                                       f"relaunched (launch {self._launches}): work is undone"),
                         at)
        elif what == "absorbed":
            self.say(f"{who}: takes {self._label(coll)} from its submission queue", at)
        elif what == "loaded":
            if coll in self._preempted:
                self.say(f"{who}: resumes {self._label(coll)} at step {e['step']}, where it "
                         "stopped", at)
            else:
                self.say(f"{who}: starts {self._label(coll)}", at)
        elif what == "completed":
            self._preempted.pop(coll, None)
            self.say(f"{who}: completes {self._label(coll)}", at)
        elif what == "quit":
            if self.baseline:
                self.say(f"{who}: the kernel exits", at)
            elif not self._quits:
                self.say(f"{who}: quits (no progress for a while): the GPU is free, so a "
                         "device sync can return; the host relaunches it while work is undone",
                         at)
            else:
                self.say(f"{who}: quits", at)
            self._quits += 1

    # -- the thread ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Tell what is left in the log, and stop."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._look()
        self._flush_repeat()

    def _loop(self) -> None:
        while not self._stop.wait(POLL):
            try:
                self._look()
                if self.lead:
                    self._look_at_world()
            except Exception as exc:      # a narration that fails must not hide the lesson
                self.say(f"(narration stopped: {exc!r})")
                return

    def _look(self) -> None:
        events = self.comm.trace()
        for e in events[self._seen:]:
            self._event(e)
        self._seen = len(events)

    def _look_at_world(self) -> None:
        statuses = self.comm.status()
        edges = wait_edges(statuses, self.names)
        # a graph is told once it held for two looks: waits of a few microseconds come
        # and go between looks
        if edges == self._candidate and edges != self._graph:
            self._graph = edges
            self.graphs.append(edges)
            self._flush_repeat()
            self.say(format_graph(edges))
        self._candidate = edges
        moved = (sum(st["steps"] for st in statuses),
                 sum(st["outstanding"] for st in statuses))
        last, since, told = self._progress
        now = time.monotonic()
        if moved != last:
            self._progress = (moved, now, 0.0)
        elif moved[1] and now - since >= told + QUIET:
            told = now - since
            self._progress = (moved, since, told)
            self._flush_repeat()
            self.say(f"... no progress on any rank for {told:.0f} s; the watchdog calls it a "
                     f"deadlock after {self.watchdog:g} s")
