"""The simulation behind :func:`pydfccl.sched.model.run_schedule`: N ranks' hosts and
daemons, tick by tick (the model's rules: :mod:`pydfccl.sched.model`)."""

from __future__ import annotations

import bisect
import random

from ..protocol.collectives import split_output
from .policies import NEVER, PREEMPTED
from .quiet import default_quiet_ticks, longest_pass, quits_ever
from .schedule import COMPLETED, DEADLOCK, LIVELOCK, Result
from .steps import OneShotColl, RingColl, SplitColl
from .wait_graph import find_wait_cycle

__all__ = ["Simulation"]

_SPIN, _IDLE = "spin", "idle"  # what a daemon asks for in its next turn
_PREEMPTED = PREEMPTED         # sent back into the daemon instead of a spin count
_IDLE_SCAN = 1 << 16           # empty polls looked ahead in one jump


class _Task:
    """A collective as one rank's daemon sees it (the kernel's saved context, with the
    policy's word ``memo``)."""

    __slots__ = ("coll", "seq", "key", "priority", "try_count", "memo")

    def __init__(self, coll, seq, key, priority):
        self.coll, self.seq, self.key, self.priority = coll, seq, key, priority
        self.try_count = self.memo = 0


def _task_key(task):
    return task.key


class _Rank:
    __slots__ = ("r", "program", "pc", "start", "pending", "active", "outstanding", "seq",
                 "daemon", "req", "task", "threshold", "spins", "idle", "resume",
                 "relaunch_at", "launches", "steps", "launch_steps", "order", "stream")

    def __init__(self, r, program, start):
        self.r, self.program, self.pc, self.start = r, program, 0, start
        self.stream = []        # ("wait", coll) and ("submit", coll) items, in stream order
        self.pending, self.active, self.outstanding, self.seq = [], [], 0, 0
        self.daemon = self.req = self.task = self.resume = self.relaunch_at = None
        self.threshold = self.spins = self.idle = self.launches = 0
        self.steps = self.launch_steps = 0
        self.order = []


class _Stop(Exception):
    def __init__(self, outcome):
        self.outcome = outcome


class Simulation:
    """One run of a schedule: ``run()`` ticks until it completes, deadlocks or livelocks and
    returns the :class:`Result`."""

    def __init__(self, schedule, policy, params, nslots, slot_elems, one_shot_elems,
                 relaunch_ticks, seed, start_ticks, max_quiet_ticks, values):
        n = schedule.nranks
        self.n = n
        self.p = tuple(int(x) for x in params)
        (self.threshold_on_load, self.threshold_after_wait, self.tries_per_pass,
         self.order_key, self.should_quit, self.remember) = policy.functions
        self.remembers = policy.remembers
        self.quits_ever = quits_ever(self.should_quit, self.p)
        self.relaunch_ticks = relaunch_ticks
        self.rng = None if seed is None else random.Random(seed)
        starts = list(start_ticks) if start_ticks is not None else [0] * n
        self.ranks = [_Rank(r, schedule.ranks[r], starts[r]) for r in range(n)]
        self.priority = {c: k.priority for c, k in schedule.collectives.items()}
        self.index = {c: i for i, c in enumerate(sorted(schedule.collectives))}  # as prepared
        self.colls = {}
        self.expected = {}
        self.per_rank = frozenset(c for c, k in schedule.collectives.items()
                                  if k.kind == "all_to_allv")
        for cid, k in sorted(schedule.collectives.items()):
            sizes = [sum(row) for row in k.counts] if k.counts else [k.count] * n
            own = values[cid] if values is not None else \
                [[(r + 1) * (e + 1) + cid for e in range(sizes[r])] for r in range(n)]
            if k.kind == "all_to_allv":
                self.colls[cid] = SplitColl(cid, k.count, k.counts, n, nslots, slot_elems, own)
                self.expected[cid] = [split_output(own, k.counts, r).tolist() for r in range(n)]
                continue
            if k.count <= one_shot_elems:
                self.colls[cid] = OneShotColl(cid, k.count, n, nslots, own)
            else:
                self.colls[cid] = RingColl(cid, k.count, n, nslots, slot_elems, own)
            self.expected[cid] = [sum(col) for col in zip(*own)]
        self.auto_quiet = max_quiet_ticks is None
        self.budget_seen = 0    # the longest budget the quiet window allows for
        if self.auto_quiet:
            longest, self.budget_seen = longest_pass(
                self.threshold_on_load, self.tries_per_pass, self.p,
                sorted(self.priority.values())) if self.quits_ever else (0, 0)
            max_quiet_ticks = default_quiet_ticks(self.should_quit, self.p, n,
                                                  self.quits_ever, longest)
        self.max_quiet = max_quiet_ticks
        self.t = 0
        self.changed = False
        self.last_progress = 0
        self.epoch = 0
        self.checked_epoch = -1
        self.preemptions = self.quits = 0
        self.hosts_left = sum(1 for rk in self.ranks if rk.program)
        self.outstanding = 0

    # -- bookkeeping ----------------------------------------------------------------------
    def _progress(self):
        self.changed = True
        self.last_progress = self.t
        self.epoch += 1

    def _launch(self, rk):
        rk.daemon = self._daemon(rk)
        rk.req = rk.resume = rk.relaunch_at = None
        rk.launches += 1
        rk.launch_steps = rk.steps
        self.changed = True

    def _exit(self, rk):
        """The daemon quit. A blocked device sync returns; the host relaunches the daemon
        for outstanding work: at once if this launch made progress, else after a pause
        (or at the next submission), as the communicator's launch loop does."""
        rk.daemon = rk.req = None
        self.quits += 1
        self.changed = True
        if self._at(rk, "sync") and not rk.stream:
            self._host_advance(rk)
        if rk.outstanding:
            stuck = rk.steps == rk.launch_steps
            rk.relaunch_at = self.t + (self.relaunch_ticks if stuck else 1)

    def _at(self, rk, op):
        """The rank's host has begun and its next event is ``op``."""
        return rk.pc < len(rk.program) and rk.program[rk.pc].op == op and self.t >= rk.start

    def _launch_blocked(self, rk):
        """A host in a device sync behind its stream's wait holds up the rank's launches."""
        return bool(rk.stream) and self._at(rk, "sync")

    def _longer_budget(self, threshold):
        """A budget longer than the quiet window allows for (one that a policy's word
        raised): widen the window to passes of such budgets."""
        self.budget_seen = threshold
        if self.auto_quiet and self.quits_ever and threshold < NEVER:
            tries = max(max(1, self.tries_per_pass(self.p, h, prio))
                        for h in (0, 1) for prio in set(self.priority.values()))
            longest = tries * threshold * len(self.colls)
            self.max_quiet = max(self.max_quiet, default_quiet_ticks(
                self.should_quit, self.p, self.n, True, longest))

    def _submit(self, rk, cid):
        coll = self.colls[cid]
        rk.seq += 1
        priority = self.priority[cid]
        key = self.order_key(self.p, priority, rk.seq, self.index[cid])
        rk.pending.append(_Task(coll, rk.seq, key, priority))
        rk.outstanding += 1
        self.outstanding += 1
        self.changed = True
        if rk.daemon is None:
            if self._launch_blocked(rk):
                rk.relaunch_at = self.t         # launched once the sync lets go
            else:
                self._launch(rk)

    def _advance_stream(self, rk):
        """The stream passes the waits whose collective has completed on this rank, and
        submits what follows them."""
        while rk.stream:
            what, cid = rk.stream[0]
            if what == "wait" and not self.colls[cid].done[rk.r]:
                return
            rk.stream.pop(0)
            self.changed = True
            if what == "submit":
                self._submit(rk, cid)

    def _host_advance(self, rk):
        rk.pc += 1
        if rk.pc == len(rk.program):
            self.hosts_left -= 1
        self._progress()

    # -- the daemon: schedule() of pydfccl/kernels/daemon.py, one block per rank ----------
    def _daemon(self, rk):
        p, r, act = self.p, rk.r, rk.active
        act.sort(key=_task_key)        # start(): the active tasks, in order
        rk.idle = 0
        pos, cur, tries_left, threshold = 0, None, 0, 0
        while True:
            if cur is None:
                if pos == 0:                                  # a new pass over the tasks
                    if rk.pending:                            # absorb new submissions;
                        rk.idle = 0                           # new work is activity
                    for task in rk.pending:
                        bisect.insort(act, task, key=_task_key)
                    rk.pending.clear()
                    if not act:
                        # Empty polls run in _turn, one a tick (idle += 1; exit when
                        # should_quit), until a submission arrives (False) or it quits.
                        if (yield _IDLE):
                            return
                        continue
                if pos >= len(act):                           # the pass is over
                    if self.should_quit(p, rk.idle):
                        return
                    pos = 0
                    continue
                is_head = 1 if pos == 0 else 0
                cur = act[pos]
                if tries_left <= 0:
                    tries_left = max(1, self.tries_per_pass(p, is_head, cur.priority))
                cur.try_count += 1
                threshold = self.threshold_on_load(p, is_head, cur.try_count, cur.priority,
                                                   cur.memo)
                if threshold > self.budget_seen:
                    self._longer_budget(threshold)
            coll = cur.coll
            if coll.step[r] == coll.nsteps:                   # done: retire it
                del act[pos]
                tries_left = 0
                self._retire(rk, cur)
                cur = None
                continue
            rk.task, rk.threshold, rk.spins = cur, threshold, 0
            spins = yield _SPIN                               # _turn spins, once a tick
            if spins == _PREEMPTED:
                if self.remembers:
                    cur.memo = self.remember(p, cur.memo, threshold, PREEMPTED, cur.priority)
                cur = None
                # the kernel's clock ran for every check the budget allowed, and a budget
                # of 0 still checks once: time passes, so a stuck daemon comes to quit
                rk.idle += max(threshold, 1)
                tries_left -= 1
                if tries_left <= 0:
                    pos += 1
                continue
            threshold = self.threshold_after_wait(p, threshold, spins, cur.priority)
            if self.remembers:
                cur.memo = self.remember(p, cur.memo, threshold, spins, cur.priority)
            rk.idle = 0

    def _retire(self, rk, task):
        rk.outstanding -= 1
        self.outstanding -= 1
        task.coll.done[rk.r] = True
        rk.order.append(task.coll.cid)
        self._progress()

    # -- one turn of one rank -------------------------------------------------------------
    def _host(self, rk):
        ev = rk.program[rk.pc]
        if ev.op == "submit":
            self._host_advance(rk)
            if rk.stream:                                 # gated behind the stream's waits
                rk.stream.append(("submit", ev.coll))
            else:
                self._submit(rk, ev.coll)
        elif ev.op == "stream_wait":
            rk.stream.append(("wait", ev.coll))
            self._host_advance(rk)
        elif self._host_wait(rk) == 0:                    # sync, wait_all, wait
            self._host_advance(rk)

    def _turn(self, rk):
        self._advance_stream(rk)
        if (rk.daemon is None and rk.relaunch_at is not None and self.t >= rk.relaunch_at
                and not self._launch_blocked(rk)):
            self._launch(rk)
        if rk.pc < len(rk.program) and self.t >= rk.start:
            self._host(rk)
        if rk.daemon is None:
            return
        while True:
            if rk.req is None:
                try:
                    rk.req = rk.daemon.send(rk.resume)
                except StopIteration:
                    self._exit(rk)
                    return
                self.changed = True
            if rk.req is _SPIN:
                break
            if rk.pending:                                # a submission ends the polling
                rk.req, rk.resume = None, False
                continue
            rk.idle += 1                                  # one empty poll
            if not self.should_quit(self.p, rk.idle):
                return
            rk.req, rk.resume = None, True
        coll, r = rk.task.coll, rk.r
        if coll.ready(r):
            coll.do_step(r)
            rk.steps += 1
            rk.resume, rk.req = rk.spins, None
            self._progress()
        else:
            rk.spins += 1
            if rk.spins >= rk.threshold:
                self.preemptions += 1
                rk.resume, rk.req = _PREEMPTED, None
                self.changed = True

    # -- the clock ------------------------------------------------------------------------
    def run(self):
        order = list(range(self.n))
        try:
            while True:
                self.changed = False
                if self.rng is not None:
                    self.rng.shuffle(order)
                for r in order:
                    self._turn(self.ranks[r])
                self.t += 1
                if self.hosts_left == 0 and self.outstanding == 0:
                    raise _Stop(COMPLETED)
                if not self.changed:
                    self._skip_ahead()
                elif self.epoch != self.checked_epoch and \
                        self.t - self.last_progress >= 4 * self.n:
                    self.checked_epoch = self.epoch
                    if self._frozen():
                        raise _Stop(DEADLOCK)
                if self.t - self.last_progress > self.max_quiet and \
                        all(self.t >= rk.start for rk in self.ranks if rk.pc < len(rk.program)):
                    raise _Stop(LIVELOCK)
        except _Stop as stop:
            return self._result(stop.outcome)

    def _skip_ahead(self):
        """Nothing changed this tick: jump to the next tick where something can.

        Spinning daemons keep failing the same check until their budget runs out; polling
        daemons keep counting empty polls until should_quit says yes (asked poll by poll, at
        most ``_IDLE_SCAN`` per jump, since a policy need not be monotonic).
        """
        ticks = NEVER
        idlers = []
        for rk in self.ranks:
            if rk.daemon is not None:
                if rk.req is _IDLE:
                    idlers.append(rk)
                elif rk.threshold < NEVER:
                    ticks = min(ticks, rk.threshold - rk.spins - 1)
            elif rk.relaunch_at is not None and not self._launch_blocked(rk):
                ticks = min(ticks, rk.relaunch_at - self.t)
            if rk.pc < len(rk.program):
                ticks = min(ticks, self._host_wait(rk))
        if idlers and self.quits_ever:
            ticks = min(ticks, _IDLE_SCAN)
            for rk in idlers:
                for i in range(1, ticks + 1):
                    if self.should_quit(self.p, rk.idle + i):
                        ticks = i - 1
                        break
        if ticks >= NEVER:
            raise _Stop(DEADLOCK)  # every daemon spins or polls forever: nothing can change
        if ticks > 0:
            for rk in idlers:
                rk.idle += ticks
            for rk in self.ranks:
                if rk.daemon is not None and rk.req is _SPIN:
                    rk.spins += ticks
            self.t += ticks

    def _host_wait(self, rk):
        """Ticks until this host can take its next event, as far as it alone decides."""
        if self.t < rk.start:
            return rk.start - self.t
        ev = rk.program[rk.pc]
        if ev.op in ("submit", "stream_wait") or \
                (ev.op == "sync" and rk.daemon is None and not rk.stream) or \
                (ev.op == "wait_all" and rk.outstanding == 0 and not rk.stream) or \
                (ev.op == "wait" and self.colls[ev.coll].done[rk.r]):
            return 0
        return NEVER

    def _frozen(self):
        """True when no step anywhere can run and no host can move: a deadlock whatever the
        daemons do (they can only preempt, quit and relaunch from here on). A host in a
        sync behind its stream's wait moves only once a step completes that collective."""
        for rk in self.ranks:
            if rk.pc < len(rk.program):
                op = rk.program[rk.pc].op
                waiting = (op in ("wait_all", "wait") and self._host_wait(rk) != 0) or \
                    (op == "sync" and rk.stream)      # behind a stream wait: steps must come
                if self.t < rk.start or not waiting:
                    return False
            if rk.daemon is None and self._launch_blocked(rk):
                continue                  # no daemon can run this rank's steps
            for task in rk.pending + rk.active:
                coll = task.coll
                if coll.step[rk.r] == coll.nsteps or coll.ready(rk.r):
                    return False
        return True

    # -- the report -----------------------------------------------------------------------
    def _waits(self, outcome):
        waits = {}
        for rk in self.ranks:
            if outcome == DEADLOCK and rk.req is _SPIN and rk.threshold >= NEVER:
                tasks = [rk.task]       # a daemon that spins forever waits on this one only
            else:
                tasks = sorted(rk.pending + rk.active, key=_task_key)
            pairs = [(t.coll.cid, w) for t in tasks for w in t.coll.blockers(rk.r)]
            if pairs:
                waits[rk.r] = pairs
        return waits

    def _result(self, outcome):
        waits = self._waits(outcome) if outcome != COMPLETED else {}
        cycle = None
        if outcome == DEADLOCK:
            ring = find_wait_cycle({r: [w for _, w in pairs] for r, pairs in waits.items()})
            if ring:
                cycle = []
                for i, r in enumerate(ring):
                    nxt = ring[(i + 1) % len(ring)]
                    cycle.append((r, next(c for c, w in waits[r] if w == nxt), nxt))
        blocked = {rk.r: rk.program[rk.pc].op for rk in self.ranks
                   if rk.pc < len(rk.program) and outcome != COMPLETED}
        values = {cid: [coll.out[r] if coll.done[r] else None for r in range(self.n)]
                  for cid, coll in self.colls.items()}
        return Result(outcome, self.t, self.preemptions, self.quits,
                      sum(max(rk.launches - 1, 0) for rk in self.ranks),
                      [rk.order for rk in self.ranks], values, self.expected, cycle, waits,
                      blocked, self.per_rank)

