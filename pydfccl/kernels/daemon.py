"""The daemon kernel: one persistent launch per rank that runs every collective.

Each block is one channel and never waits for another block. Thread 0 of a block schedules:
it takes new work from the submission queue (SQ), keeps the block's active tasks sorted by
the policy's order, loads a task (restoring its saved context), spins for the next step's
data and slot credit within the policy's time budget (nanoseconds, ``%globaltimer``), and
either hands the step to the whole block (``move``) or preempts the task, saving its
context. A collective takes the blocks it has channels for (``ring.channel_count``), and
the last of them to finish a run writes the completion queue (CQ). Thread 0
also appends every event (task absorbed, loaded, preempted, completed; block launched,
quit) to the block's event log in the pool, which the host drains for
``Communicator.trace()``. When the policy says the rank has gone too long without progress
(no block of it moved a step or took new work: idle, or stuck) a block exits (voluntary
quit); once one block of a launch has exited the others follow at their next look,
so the launch ends whole and soon, and the host relaunches it when work is outstanding.
The rank's blocks share the SQ's polling: reads of host memory queue behind one another
(about 1.2 us for each read ahead on the H200, layout.py), so a block's reads can delay
every other block's. A rank keeps at most one SQ read in flight, one every
SQ_POLL_NS at most, made by whichever block takes the turn (the pool's ``sq_next_poll``;
idle blocks before busy ones), and the block that finds new entries copies them into
device memory (the pool's ``sq_copy``) and posts how far it saw (``sq_seen``), where its
siblings look first and read the copies instead of the SQ: an entry crosses PCIe once per
rank, not once per block. The abort word is shared the same way
(``primitives.abort_seen``), and a launch starts from the policy's parameters and the
blocks' counters in the pool, not in host memory. A launch takes SQ entries up to
its ``limit`` argument: the persistent daemon has none (``layout.NO_LIMIT``); the
launch-per-collective baseline passes the runs submitted when it was launched, so that
every block of a launch takes the same runs and leaves the rest to the next launch whole.

``make_daemon(policy, nthreads)`` compiles the policy's functions into a daemon (one
signature: nine int64 scalars; cached on disk under a key of its sources, see
``compiler``); one kernel per policy and register cap (blocks of up to 256 threads get
more registers than wider ones), everything else (sizes, counts, parameters) is data.
``compile_now`` compiles before the first launch, so that compilation time is not taken
for a stall. With ``PYDFCCL_PROFILE_STEPS=1`` thread 0 also counts its cycles in each
phase of its loop (``step_profile``); without it those marks compile to nothing.
"""

import numpy as np
from numba import cuda

from ..protocol import layout as L
from ..sched.policies import PARAM_SLOTS, PREEMPTED
from . import step_profile
from .compiler import daemon_kernel
from .divide import remainder
from .limits import MAX_THREADS, register_cap
from .memory import (as_array, atomic_add_gpu, atomic_max_gpu, backoff, fence_gpu, fence_sys,
                     load16, load_acquire, load_volatile, now_ns, sm_id, store16,
                     store_volatile)
from .primitives import (F_ALL, F_POSTDIV, F_RECV, F_SEND, SPIN_ABORT, SPIN_PREEMPT,
                         abort_seen, fence, first_unready, move, move_all, ready_now,
                         spin_wait, take_turn)
from .plans import (KIND_ALL_TO_ALLV, SPLIT_TRAILER_BYTES, device_lane_bytes, loop_counted,
                    loop_elems, plan_step, slot_payload, split_step, step_peers,
                    steps_per_loop)
from .ring import channel_span, ring_index
from .step_profile import PROFILE_STEPS, SHARED_WORDS as PROFILE_SHARED_WORDS, lap
from .thread0_state import SLOT, S_WORDS

assert SPIN_PREEMPT == PREEMPTED      # what ``remember`` sees as ``waited`` at a preemption

__all__ = ["make_daemon", "compile_now", "DAEMON_SIGNATURE"]

MAX_COLLS, NO_LIMIT = L.MAX_COLLS, L.NO_LIMIT
CTL_ABORT = L.CTL_ABORT
CTL_BLOCKS, BS_SIZE = L.CTL_BLOCKS, L.BS_SIZE
BS_COLL, BS_STEP, BS_WAITS, BS_FAULT = (L.BS[k] for k in ("coll", "step", "waits", "fault"))
FAULT_RANK = L.FAULT_RANK
BS_COMPLETED, BS_PREEMPTIONS, BS_EXITS, BS_PROGRESS = (
    L.BS[k] for k in ("completed", "preemptions", "exits", "progress"))
CTL_SQ, SQ_SIZE, SQ_CAP = L.CTL_SQ, L.SQ_SIZE, L.SQ_CAP
SQ_SEQ, SQ_COLL, SQ_RECV = (L.SQ_F[k] for k in ("seq", "coll", "recv"))
CTL_CQ, CQ_SIZE, CQ_CAP = L.CTL_CQ, L.CQ_SIZE, L.CQ_CAP
CQ_STAMP, CQ_COLL = L.CQ_F["stamp"], L.CQ_F["coll"]
P_CQ_RESERVE, P_DONE, P_COLLS, P_SQ_FRONTIER, P_TASKS, P_BLOCK_QUITS = (
    L.P_CQ_RESERVE, L.P_DONE, L.P_COLLS, L.P_SQ_FRONTIER, L.P_TASKS, L.P_BLOCK_QUITS)
P_RANK_PROGRESS, P_SQ_SEEN, P_SQ_COPY = L.P_RANK_PROGRESS, L.P_SQ_SEEN, L.P_SQ_COPY
P_SQ_NEXT_POLL, P_ABORT, P_PARAMS, P_PEERS_LOCAL = (
    L.P_SQ_NEXT_POLL, L.P_ABORT, L.P_PARAMS, L.P_PEERS_LOCAL)
assert L.POOL_HEADER.fields["params"][0].shape == (PARAM_SLOTS,)
assert L.POOL_HEADER.fields["step_phases"][0].shape == (step_profile.PROFILE_WORDS,)
P_COUNTS, BC_SIZE, P_STEP_PHASES = L.P_COUNTS, L.BC_SIZE, L.P_STEP_PHASES
BC_COMPLETED, BC_PREEMPTIONS, BC_PROGRESS, BC_EXITS = (
    L.BC[k] for k in ("completed", "preemptions", "progress", "exits"))
SQ_COPY_SIZE = L.SQ_COPY_SIZE
SC_COLL, SC_RECV = L.SQ_COPY_F["coll"], L.SQ_COPY_F["recv"]
# The collective table and a block's task contexts are read and written with plain
# (cacheable, pipelined) loads and stores: the table is constant while the daemon runs and
# a block's contexts belong to that block's thread 0 alone. Offsets in int64 words.
COLL_WORDS, TASK_WORDS = L.COLL_SIZE // 8, L.TASK_SIZE // 8
C_KIND, C_DTYPE, C_OP, C_COUNT, C_ROOT, C_NCH, C_ITEMSIZE, C_CONN = (
    L.COLL_F[k] // 8 for k in ("kind", "dtype", "op", "count", "root", "nchannels", "itemsize",
                               "conn"))
T_ACTIVE, T_SEQ, T_SEND, T_RECV, T_STEP, T_LOOP, T_TRIES, T_SENT, T_RECVD, T_PRIO = (
    L.TASK_F[k] // 8 for k in ("active", "seq", "send", "recv", "step", "loop", "tries", "sent",
                               "recvd", "priority"))
T_RUNS, T_QUEUED, T_DEQUEUED = (L.TASK_F[k] // 8 for k in ("runs", "queued", "dequeued"))
T_MEMO = L.TASK_F["memo"] // 8     # the policy's word (``remember``), in the saved context
# Runs absorbed while a run of their collective is active wait in the block's queue of that
# collective (block-private too), RUNS - 1 deep: the host keeps at most RUNS in flight.
RUNS = L.RUNS_IN_FLIGHT
QUEUE_WORDS = L.QUEUE_SIZE // 8
Q_SEQ, Q_SEND, Q_RECV, Q_PRIO = (L.QUEUE_F[k] // 8 for k in ("seq", "send", "recv", "priority"))
P_QUEUE = L.P_QUEUE
P_TRACE_HEAD, P_TRACE, TRACE_SIZE, TRACE_CAP = L.P_TRACE_HEAD, L.P_TRACE, L.TRACE_SIZE, L.TRACE_CAP
EV_ABSORBED, EV_LOADED, EV_PREEMPTED, EV_COMPLETED, EV_LAUNCHED, EV_QUIT = (
    {name: code for code, name in L.TRACE_KINDS.items()}[k]
    for k in ("absorbed", "loaded", "preempted", "completed", "launched", "quit"))
HEADER_BYTES, CONN_HEADER, CONN_TAIL, CONN_HEAD, CONN_LANES = (
    L.HEADER_BYTES, L.CONN_HEADER_BYTES, L.CONN_TAIL, L.CONN_HEAD, L.CONN_LANES)

# Shared words thread 0 hands to the block.
SH_CMD, SH_DTYPE, SH_N, SH_FLAGS, SH_OP, SH_DIV, SH_SLOT_IN, SH_USER_IN, SH_SLOT_OUT, \
    SH_USER_OUT, SH_NACT = range(11)
SH_CQ_K = 12            # from here, the CQ numbers of completions thread 0 holds back
CMD_MOVE, CMD_EXIT = 1, 2

# Thread 0's scheduler state: a local array (device functions update it), its slots the
# fields of thread0_state.THREAD0_STATE.
(S_POS, S_CUR, S_TRIES_LEFT, S_THRESH, S_KIND, S_IDLE_SINCE, S_FRONTIER, S_STEP, S_LOOP,
 S_SENT, S_RECVD, S_SEND, S_RECV, S_SPLIT_ROW, S_BEGIN, S_END, S_NLOOPS, S_SLOT_ELEMS,
 S_DTYPE, S_OP, S_ITEMSIZE, S_TRIES, S_COMPLETED, S_PREEMPTIONS, S_PROGRESS, S_FLAGS, S_ROOT,
 S_COUNT,
 S_ABORT_SEEN, S_LOCAL, S_TRACE_HEAD, S_CONN, S_TO_CONN, S_FROM_CONN, S_QUITS0,
 S_EXITS, S_CQ_HELD, S_CQ_SINCE) = (SLOT[name] for name in (
    "pos", "cur", "tries_left", "thresh", "kind", "idle_since", "frontier", "step", "loop",
    "sent", "recvd", "send", "recv", "split_row", "begin", "end", "nloops", "slot_elems",
    "dtype", "op", "itemsize", "tries", "completed", "preemptions", "progress", "flags", "root",
    "count",
    "abort_seen", "local", "trace_head", "conn", "to_conn", "from_conn", "quits0",
    "exits", "cq_held", "cq_since"))
# Completions a block holds back (S_CQ_HELD of them, their CQ numbers in shared memory from
# SH_CQ_K on, the first since S_CQ_SINCE; a local array indexed at run time would leave
# registers for local memory): published together behind one system fence before the
# block waits for a peer, at each pass over its tasks, when CQ_BATCH are held or the first
# has waited CQ_HOLD_NS, and when the block exits.
CQ_BATCH = 8
CQ_HOLD_NS = 5_000
SH_WORDS = SH_CQ_K + CQ_BATCH
ADDR_WORDS = CONN_LANES + 1     # an F_ALL step's addresses: one per rank

# Host memory is a PCIe round trip away, and reads of it queue (layout.py), so
# the hot path and the idle loop avoid it: a block looks at the rank's abort flag (device
# memory) every ABORT_CHECK_NS, and writes its status row (what the watchdog reports) only
# when a wait has lasted QUICK_WAIT_NS, at a preemption, a completion, a quit, and every
# PROGRESS_EVERY steps. The SQ's turn (``_sq_turn``):
ABORT_CHECK_NS = 20_000
SQ_POLL_NS = 500          # from the end of a rank's SQ read to its next, at least
SQ_POLL_BUSY_NS = 5_000   # how overdue a read must be for a block with tasks to make it
SQ_POLL_HELD_NS = 1_000_000   # a turn taken lapses after this (a read takes microseconds)
QUICK_WAIT_NS = 20_000
PROGRESS_EVERY = 64

OP_AVG = 4

DAEMON_SIGNATURE = "void(int64, int64, int64, int64, int64, int64, int64, int64, int64)"

step_word = cuda.jit(device=True)(L.pack_step)    # the status row's and event log's


@cuda.jit(device=True)
def _conn(base, conn, block, nblocks, conn_stride):
    """Block ``block``'s connector of connector set ``conn`` in the pool at ``base``."""
    return base + HEADER_BYTES + (conn * nblocks + block) * conn_stride


@cuda.jit(device=True)
def _status(ctl, block):
    return ctl + CTL_BLOCKS + block * BS_SIZE


@cuda.jit(device=True)
def _remove(act, akey, sh, pos):
    n = sh[SH_NACT]
    for i in range(pos, n - 1):
        act[i] = act[i + 1]
        akey[i] = akey[i + 1]
    sh[SH_NACT] = n - 1


@cuda.jit(device=True)
def _insert(act, akey, sh, coll, key):
    n = sh[SH_NACT]
    i = n
    while i > 0 and akey[i - 1] > key:
        act[i] = act[i - 1]
        akey[i] = akey[i - 1]
        i -= 1
    act[i] = coll
    akey[i] = key
    sh[SH_NACT] = n + 1


@cuda.jit(device=True)
def _span(colls, coll, block, nranks, slot_bytes):
    """(begin, end, nloops, slot_elems) of this block's share of a collective."""
    entry = coll * COLL_WORDS
    count = colls[entry + C_COUNT]
    nch = colls[entry + C_NCH]
    slot_elems = slot_payload(colls[entry + C_KIND], slot_bytes, colls[entry + C_ITEMSIZE])
    if block >= nch:
        return 0, 0, 0, slot_elems
    begin, end = channel_span(count, nch, block)
    loop_size = loop_elems(colls[entry + C_KIND], nranks, slot_elems)
    return begin, end, (end - begin + loop_size - 1) // loop_size, slot_elems


@cuda.jit(device=True)
def _trace(st, pool, block, event, coll, detail, waited, flags):
    """Append one record to this block's event log (thread 0; the host drains it)."""
    i = st[S_TRACE_HEAD]
    record = pool + P_TRACE + (block * TRACE_CAP + i % TRACE_CAP) * TRACE_SIZE
    store_volatile(record, now_ns())
    store_volatile(record + 8, event)
    store_volatile(record + 16, coll)
    store_volatile(record + 24, detail)
    store_volatile(record + 32, waited)
    store_volatile(record + 40, flags)
    st[S_TRACE_HEAD] = i + 1
    store_volatile(pool + P_TRACE_HEAD + block * 8, i + 1)


@cuda.jit(device=True)
def _publish(st, status, waits):
    """Write what this block waits for to its status row (host memory, for the watchdog):
    ``waits`` is WAITS_DATA | WAITS_CREDIT flags, the rank the data comes from << 2 and the
    rank the credit comes from << 18 (see watchdog.rank_status)."""
    store_volatile(status + BS_COLL, st[S_CUR] + 1)
    store_volatile(status + BS_STEP, step_word(st[S_LOOP], st[S_STEP]))
    store_volatile(status + BS_WAITS, waits)
    store_volatile(status + BS_PROGRESS, st[S_PROGRESS])


@cuda.jit(device=True)
def _waits(mine, need_tail, need_head, lanes, rank, nranks, from_rank, to_rank):
    """The ``waits`` word of ``_publish`` for a step that waits at connector ``mine``; an
    ``F_ALL`` step (``lanes`` > 1) names the peers of its first lane not ready."""
    lane = first_unready(mine + CONN_TAIL, need_tail, mine + CONN_HEAD, need_head, lanes)
    if lanes > 1 and lane >= 0:
        from_rank = ring_index(rank - lane - 1 + nranks, nranks)
        to_rank = ring_index(rank + lane + 1, nranks)
    return ((1 if need_tail > 0 else 0) + (2 if need_head > 0 else 0)
            + (from_rank << 2) + (to_rank << 18))


@cuda.jit(device=True)
def _lane_addrs(addrs, flags, user_in, peers, mine, rank, nranks, conn, block, nblocks,
                conn_stride, slot_bytes, slot):
    """An ``F_ALL`` step's addresses for ``move_all``: for a send, the lane this rank
    writes in slot number ``slot`` of each peer (rank r + k's lane k - 1, at addrs[k - 1]);
    for a receive, every rank's input in rank order (the own at ``user_in``, rank r - k's
    in lane k - 1 of this rank's slot)."""
    lane = device_lane_bytes(nranks, slot_bytes)
    at = CONN_HEADER + slot * slot_bytes
    for k in range(1, nranks):
        if flags & F_SEND:
            peer = _conn(peers[ring_index(rank + k, nranks)], conn, block, nblocks,
                         conn_stride)
            addrs[k - 1] = peer + at + (k - 1) * lane
        else:
            addrs[ring_index(rank - k + nranks, nranks)] = mine + at + (k - 1) * lane
    if not flags & F_SEND:
        addrs[rank] = user_in


@cuda.jit(device=True)
def _progress(st, pool):
    """This block moved a step or took new work: activity for the whole rank (``_idle``)."""
    t = now_ns()
    st[S_IDLE_SINCE] = t
    store_volatile(pool + P_RANK_PROGRESS, t)


@cuda.jit(device=True)
def _idle(st, pool):
    """Time since the rank's last progress, any block's: a block whose share is done while
    its siblings still work on a collective is not idle, or it would quit, and the launch,
    which must end whole to be relaunched, would wait for each sibling to go idle in turn
    (on an H200, 256 MiB runs waited one by one took 14.6 ms that way, 2.0 ms once idle
    was the rank's)."""
    return now_ns() - max(st[S_IDLE_SINCE], load_volatile(pool + P_RANK_PROGRESS))


@cuda.jit(device=True)
def _sq_turn(pool, busy):
    """Whether this block reads the SQ now: the rank's turn is due (SQ_POLL_BUSY_NS overdue
    for a block that has tasks of its own, so that idle blocks poll while there are any),
    and this block took it. The taker pushes ``sq_next_poll`` out until its read is done
    (``_copy_sq`` then sets it SQ_POLL_NS ahead): one SQ read in flight per rank."""
    return take_turn(pool + P_SQ_NEXT_POLL, SQ_POLL_BUSY_NS if busy else 0, SQ_POLL_HELD_NS)


@cuda.jit(device=True)
def _copy_sq(ctl, pool, f, limit):
    """At the rank's SQ turn: copy the SQ's entries from ``f`` on (up to entry ``limit``)
    into the pool's ``sq_copy`` and raise ``sq_seen`` past them, before any is taken, so
    that the block with a run's share learns of it with the block that read it (on an
    H200 a sibling took a run 2.1 to 3.2 us after the reader when the copies were
    published after the reader's own takes, 0.3 to 1.1 us this way). Returns the new
    ``sq_seen``."""
    first = f
    entry = ctl + CTL_SQ + (f % SQ_CAP) * SQ_SIZE
    seq = load_acquire(entry + SQ_SEQ)
    while seq == f + 1 and f < limit:
        # Plain 16-byte loads after the acquire: the two, and the next entry's sequence
        # word, cross PCIe together.
        coll, send = load16(entry + SQ_COLL)
        recv, prio = load16(entry + SQ_RECV)
        entry = ctl + CTL_SQ + ((f + 1) % SQ_CAP) * SQ_SIZE
        seq = load_acquire(entry + SQ_SEQ)
        c = pool + P_SQ_COPY + (f % SQ_CAP) * SQ_COPY_SIZE
        store16(c + SC_COLL, coll, send)
        store16(c + SC_RECV, recv, prio)
        f += 1
    if f != first:
        atomic_max_gpu(pool + P_SQ_SEEN, f)   # release: the copies before it
    store_volatile(pool + P_SQ_NEXT_POLL, now_ns() + SQ_POLL_NS)   # the turn is over
    return f


@cuda.jit(device=True)
def _publish_cq(st, sh, ctl):
    """Stamp the CQ entries this block held back. One system fence orders every held
    entry's collective word (and the runs' data) before the stamps, which the host reads
    with acquire loads, in order: one fence for a batch where each entry had a release
    store of its own."""
    held = st[S_CQ_HELD]
    if held == 0:
        return
    fence_sys()
    for i in range(held):
        k = sh[SH_CQ_K + i]
        store_volatile(ctl + CTL_CQ + (k % CQ_CAP) * CQ_SIZE + CQ_STAMP, k + 1)
    st[S_CQ_HELD] = 0


@cuda.jit(device=True)
def _finish(st, sh, ctl, pool, colls, tasks, coll, block):
    """This block is done with a run of ``coll``; the last of the collective's channels
    (blocks) to finish that run writes the CQ. A block may finish a collective's next runs
    before another block finishes this one, so the blocks count each run in flight apart
    (run number modulo RUNS: the host never has more in flight)."""
    _trace(st, pool, block, EV_COMPLETED, coll, 0, 0, 0)
    st[S_COMPLETED] += 1
    task = coll * TASK_WORDS
    run = tasks[task + T_RUNS]
    tasks[task + T_RUNS] = run + 1
    old = atomic_add_gpu(pool + P_DONE + (coll * RUNS + run % RUNS) * 8, 1)
    if (old + 1) % colls[coll * COLL_WORDS + C_NCH] == 0:
        k = atomic_add_gpu(pool + P_CQ_RESERVE, 1)
        entry = ctl + CTL_CQ + (k % CQ_CAP) * CQ_SIZE
        store_volatile(entry + CQ_COLL, coll)
        if st[S_CQ_HELD] == 0:
            st[S_CQ_SINCE] = now_ns()
        sh[SH_CQ_K + st[S_CQ_HELD]] = k     # stamped by _publish_cq
        st[S_CQ_HELD] += 1
        if st[S_CQ_HELD] == CQ_BATCH:
            _publish_cq(st, sh, ctl)
    status = _status(ctl, block)
    store_volatile(status + BS_COLL, 0)
    store_volatile(status + BS_COMPLETED, st[S_COMPLETED])
    store_volatile(status + BS_PROGRESS, st[S_PROGRESS])


def make_daemon(policy, nthreads: int = MAX_THREADS):
    """Compile ``policy`` into a daemon kernel (all its functions become device code) for
    blocks of up to ``nthreads`` threads (``limits.register_cap``)."""
    threshold_on_load = cuda.jit(device=True)(policy.threshold_on_load)
    threshold_after_wait = cuda.jit(device=True)(policy.threshold_after_wait)
    tries_per_pass = cuda.jit(device=True)(policy.tries_per_pass)
    order_key = cuda.jit(device=True)(policy.order_key)
    should_quit = cuda.jit(device=True)(policy.should_quit)
    remember = cuda.jit(device=True)(policy.remember)
    remembers = policy.remembers     # a constant: without remember the calls compile away

    @cuda.jit(device=True)
    def _remember(st, tasks, params, waited):
        """The task's policy word after a wait ended (``waited``: PREEMPTED at a
        preemption), kept in its context at once: a preemption's save and a reload find it
        there."""
        if remembers:
            task = st[S_CUR] * TASK_WORDS
            tasks[task + T_MEMO] = remember(params, tasks[task + T_MEMO], st[S_THRESH],
                                            waited, tasks[task + T_PRIO])

    @cuda.jit(device=True)
    def _may_quit(st, params, pool):
        """Another block of this launch has quit (a collective may need any block, so a
        launch that lost one ends whole, at once, to be relaunched), or the policy says the
        rank has gone long enough without progress (idle, or stuck)."""
        if load_volatile(pool + P_BLOCK_QUITS) != st[S_QUITS0]:
            return True
        return should_quit(params, _idle(st, pool)) != 0

    @cuda.jit(device=True)
    def activate(act, akey, sh, params, tasks, coll, seq, send, recv, prio):
        """Start a run of ``coll`` on this block: a fresh context, placed in policy order.
        The slot counters (sent, recvd) carry on from the collective's previous run."""
        task = coll * TASK_WORDS
        tasks[task + T_SEQ] = seq
        tasks[task + T_SEND] = send
        tasks[task + T_RECV] = recv
        tasks[task + T_STEP] = 0
        tasks[task + T_LOOP] = 0
        tasks[task + T_TRIES] = 0
        tasks[task + T_PRIO] = prio
        tasks[task + T_MEMO] = 0
        tasks[task + T_ACTIVE] = 1
        _insert(act, akey, sh, coll, order_key(params, prio, seq, coll))

    @cuda.jit(device=True)
    def take(st, act, akey, sh, params, ctl, pool, colls, tasks, queue, block, nranks,
             slot_bytes, seq, coll, send, recv, prio):
        """A new run (SQ entry number ``seq``, from 1): activate its task, or queue it behind
        its collective's active run, or finish it at once if its channel has no elements.
        A block beyond the collective's channels leaves the run alone: small collectives
        take one channel, and a rank's other blocks (up to 31) would each log it, count
        it with an atomic and write their status rows to host memory."""
        if block >= colls[coll * COLL_WORDS + C_NCH]:
            return
        _trace(st, pool, block, EV_ABSORBED, coll, seq, 0, 0)
        begin, end, nloops, slot_elems = _span(colls, coll, block, nranks, slot_bytes)
        if nloops == 0:
            _finish(st, sh, ctl, pool, colls, tasks, coll, block)
            return
        task = coll * TASK_WORDS
        if tasks[task + T_ACTIVE] != 0:
            q = tasks[task + T_QUEUED]
            rec = (coll * (RUNS - 1) + q % (RUNS - 1)) * QUEUE_WORDS
            queue[rec + Q_SEQ] = seq
            queue[rec + Q_SEND] = send
            queue[rec + Q_RECV] = recv
            queue[rec + Q_PRIO] = prio
            tasks[task + T_QUEUED] = q + 1
            return
        activate(act, akey, sh, params, tasks, coll, seq, send, recv, prio)

    @cuda.jit(device=True)
    def absorb(st, act, akey, sh, params, ctl, pool, colls, tasks, queue, block, nranks,
               slot_bytes, limit, prof):
        """Take new SQ entries, up to entry ``limit``, from their copies in device memory
        (``sq_copy``, below ``sq_seen``). The SQ itself (host memory, each read a PCIe round
        trip) is read only at the rank's turn to poll, by the block that takes the turn,
        which copies what it found for all (``_copy_sq``)."""
        f = st[S_FRONTIER]
        seen = load_volatile(pool + P_SQ_SEEN)
        if seen > f:
            fence_gpu()          # the copies were written before sq_seen was raised
        elif _sq_turn(pool, sh[SH_NACT] > 0):
            seen = _copy_sq(ctl, pool, f, limit)
            lap(prof, step_profile.PH_SQ if seen > f or sh[SH_NACT] > 0 else
                step_profile.PH_IDLE)
        else:
            return
        last = min(seen, limit)
        while f < last:
            c = pool + P_SQ_COPY + (f % SQ_CAP) * SQ_COPY_SIZE
            coll, send = load16(c + SC_COLL)
            recv, prio = load16(c + SC_RECV)
            f += 1
            take(st, act, akey, sh, params, ctl, pool, colls, tasks, queue, block, nranks,
                 slot_bytes, f, coll, send, recv, prio)
        if f != st[S_FRONTIER]:
            st[S_FRONTIER] = f
            _progress(st, pool)   # new work is activity: the rank's blocks stay while it
            #                       runs, those without a share too (a launch ends whole)
            store_volatile(pool + P_SQ_FRONTIER + block * 8, f)

    @cuda.jit(device=True)
    def load_task(st, pool, colls, tasks, params, coll, block, nranks, slot_bytes, is_head):
        task = coll * TASK_WORDS
        entry = coll * COLL_WORDS
        st[S_CUR] = coll
        st[S_STEP] = tasks[task + T_STEP]
        st[S_LOOP] = tasks[task + T_LOOP]
        st[S_SENT] = tasks[task + T_SENT]
        st[S_RECVD] = tasks[task + T_RECVD]
        st[S_SEND] = tasks[task + T_SEND]
        st[S_RECV] = tasks[task + T_RECV]
        st[S_TRIES] = tasks[task + T_TRIES] + 1
        st[S_KIND] = colls[entry + C_KIND]
        if st[S_KIND] == KIND_ALL_TO_ALLV:    # its send word is the run's row of counts
            st[S_SPLIT_ROW] = st[S_SEND]
            st[S_SEND] = load_volatile(st[S_SEND])
        st[S_ROOT] = colls[entry + C_ROOT]
        st[S_COUNT] = colls[entry + C_COUNT]
        st[S_DTYPE] = colls[entry + C_DTYPE]
        st[S_OP] = colls[entry + C_OP]
        st[S_ITEMSIZE] = colls[entry + C_ITEMSIZE]
        st[S_CONN] = colls[entry + C_CONN]
        begin, end, nloops, slot_elems = _span(colls, coll, block, nranks, slot_bytes)
        st[S_BEGIN] = begin
        st[S_END] = end
        st[S_NLOOPS] = nloops
        st[S_SLOT_ELEMS] = slot_elems
        st[S_THRESH] = threshold_on_load(params, is_head, st[S_TRIES], tasks[task + T_PRIO],
                                         tasks[task + T_MEMO])
        _trace(st, pool, block, EV_LOADED, coll, step_word(st[S_LOOP], st[S_STEP]), 0, 0)

    @cuda.jit(device=True)
    def save_task(st, tasks, active):
        """The lazy context save: only when a task is switched out or finished."""
        task = st[S_CUR] * TASK_WORDS
        tasks[task + T_STEP] = st[S_STEP]
        tasks[task + T_LOOP] = st[S_LOOP]
        tasks[task + T_SENT] = st[S_SENT]
        tasks[task + T_RECVD] = st[S_RECVD]
        tasks[task + T_TRIES] = st[S_TRIES]
        tasks[task + T_ACTIVE] = active
        st[S_CUR] = -1

    @cuda.jit(device=True)
    def next_run(act, akey, sh, params, tasks, queue, coll):
        """After a run of ``coll`` retires: activate the next one queued behind it."""
        task = coll * TASK_WORDS
        d = tasks[task + T_DEQUEUED]
        if d == tasks[task + T_QUEUED]:
            return
        rec = (coll * (RUNS - 1) + d % (RUNS - 1)) * QUEUE_WORDS
        tasks[task + T_DEQUEUED] = d + 1
        activate(act, akey, sh, params, tasks, coll, queue[rec + Q_SEQ], queue[rec + Q_SEND],
                 queue[rec + Q_RECV], queue[rec + Q_PRIO])

    @cuda.jit(device=True)
    def schedule(st, act, akey, sh, addrs, params, ctl, pool, colls, tasks, queue, peers,
                 rank, nranks, nslots, slot_bytes, conn_stride, block, nblocks, limit, prof):
        """Thread 0: decide the block's next command (a step to move, or exit)."""
        status = _status(ctl, block)
        while True:
            if st[S_CQ_HELD] > 0 and now_ns() - st[S_CQ_SINCE] >= CQ_HOLD_NS:
                _publish_cq(st, sh, ctl)
            if st[S_CUR] < 0:
                if st[S_POS] == 0:      # a new pass over the task list
                    _publish_cq(st, sh, ctl)
                    t = now_ns()
                    if t - st[S_ABORT_SEEN] >= ABORT_CHECK_NS:
                        st[S_ABORT_SEEN] = t
                        if abort_seen(ctl + CTL_ABORT, pool + P_ABORT):
                            sh[SH_CMD] = CMD_EXIT
                            return
                    absorb(st, act, akey, sh, params, ctl, pool, colls, tasks, queue, block,
                           nranks, slot_bytes, limit, prof)
                    lap(prof, step_profile.PH_ABSORB if sh[SH_NACT] > 0 else
                        step_profile.PH_IDLE)
                    if sh[SH_NACT] == 0:
                        # A launch with a limit (the launch-per-call baseline) quits once
                        # idle, and its siblings count on this block's share of every run
                        # up to the limit: it takes them all first, at its rank's SQ turn.
                        if ((limit == NO_LIMIT or st[S_FRONTIER] >= limit)
                                and _may_quit(st, params, pool)):
                            sh[SH_CMD] = CMD_EXIT
                            return
                        backoff()
                        lap(prof, step_profile.PH_IDLE)
                        continue
                if st[S_POS] >= sh[SH_NACT]:    # the pass is over
                    if _may_quit(st, params, pool):
                        sh[SH_CMD] = CMD_EXIT
                        return
                    st[S_POS] = 0
                    continue
                is_head = 1 if st[S_POS] == 0 else 0
                if st[S_TRIES_LEFT] <= 0:
                    st[S_TRIES_LEFT] = max(1, tries_per_pass(
                        params, is_head, tasks[act[st[S_POS]] * TASK_WORDS + T_PRIO]))
                load_task(st, pool, colls, tasks, params, act[st[S_POS]], block, nranks,
                          slot_bytes, is_head)
                lap(prof, step_profile.PH_LOAD)

            coll = st[S_CUR]
            if st[S_LOOP] >= st[S_NLOOPS]:      # done: retire it
                save_task(st, tasks, 0)
                _remove(act, akey, sh, st[S_POS])
                st[S_TRIES_LEFT] = 0
                _finish(st, sh, ctl, pool, colls, tasks, coll, block)
                next_run(act, akey, sh, params, tasks, queue, coll)
                lap(prof, step_profile.PH_RETIRE)
                continue

            if st[S_KIND] == KIND_ALL_TO_ALLV:
                flags, in_first, out_first, n = split_step(
                    st[S_SPLIT_ROW], rank, nranks, st[S_BEGIN], st[S_END], st[S_LOOP],
                    st[S_STEP], st[S_SLOT_ELEMS])
            else:
                flags, in_first, out_first, n = plan_step(
                    st[S_KIND], rank, nranks, st[S_ROOT], st[S_COUNT], st[S_BEGIN],
                    st[S_END], st[S_LOOP], st[S_STEP], st[S_SLOT_ELEMS])
            to_rank, from_rank, conn = step_peers(st[S_KIND], rank, nranks, st[S_ROOT],
                                                  st[S_STEP])
            conn += st[S_CONN]
            mine = _conn(pool, conn, block, nblocks, conn_stride)
            need_tail = st[S_RECVD] + 1 if flags & F_RECV else 0
            need_head = st[S_SENT] + 1 - nslots if flags & F_SEND else 0
            lanes = nranks - 1 if flags & F_ALL else 1
            budget = st[S_THRESH]
            lap(prof, step_profile.PH_PLAN)
            if st[S_CQ_HELD] > 0 and not ready_now(mine + CONN_TAIL, need_tail,
                                                   mine + CONN_HEAD, need_head, lanes):
                _publish_cq(st, sh, ctl)     # held completions must not wait for a peer
            waited = spin_wait(mine + CONN_TAIL, need_tail, mine + CONN_HEAD, need_head, lanes,
                               min(budget, QUICK_WAIT_NS), ctl + CTL_ABORT, pool + P_ABORT,
                               st[S_LOCAL])
            if waited == SPIN_PREEMPT and budget > QUICK_WAIT_NS:
                # a long wait: let the watchdog see it
                _publish(st, status, _waits(mine, need_tail, need_head, lanes, rank, nranks,
                                            from_rank, to_rank))
                waited = spin_wait(mine + CONN_TAIL, need_tail, mine + CONN_HEAD, need_head,
                                   lanes, budget - QUICK_WAIT_NS, ctl + CTL_ABORT,
                                   pool + P_ABORT, st[S_LOCAL])
                if waited >= 0:
                    waited += QUICK_WAIT_NS
            lap(prof, step_profile.PH_WAIT)
            if waited == SPIN_ABORT:
                save_task(st, tasks, 1)
                sh[SH_CMD] = CMD_EXIT
                return
            if (waited >= 0 and st[S_KIND] == KIND_ALL_TO_ALLV and flags & F_RECV
                    and load_volatile(mine + CONN_HEADER + remainder(st[S_RECVD], nslots)
                                      * slot_bytes + slot_bytes - SPLIT_TRAILER_BYTES) != n):
                # the sender's part differs from this rank's: the host names the pair
                # (watchdog.py) and aborts; until then the step never moves
                store_volatile(status + BS_FAULT, coll + 1 + from_rank * FAULT_RANK)
                waited = SPIN_PREEMPT
            if waited == SPIN_PREEMPT:
                _trace(st, pool, block, EV_PREEMPTED, coll, step_word(st[S_LOOP], st[S_STEP]),
                       budget, flags)
                _publish(st, status, _waits(mine, need_tail, need_head, lanes, rank, nranks,
                                            from_rank, to_rank))
                _remember(st, tasks, params, PREEMPTED)
                save_task(st, tasks, 1)
                st[S_PREEMPTIONS] += 1
                store_volatile(status + BS_PREEMPTIONS, st[S_PREEMPTIONS])
                st[S_TRIES_LEFT] -= 1
                if st[S_TRIES_LEFT] <= 0:
                    st[S_POS] += 1
                continue

            st[S_THRESH] = threshold_after_wait(params, st[S_THRESH], waited,
                                                tasks[coll * TASK_WORDS + T_PRIO])
            _remember(st, tasks, params, waited)
            _progress(st, pool)
            nxt = _conn(peers[to_rank], conn, block, nblocks, conn_stride)
            st[S_TO_CONN] = nxt      # where post_step publishes the step
            st[S_FROM_CONN] = _conn(peers[from_rank], conn, block, nblocks, conn_stride)
            itemsize = st[S_ITEMSIZE]
            sh[SH_DTYPE] = st[S_DTYPE]
            sh[SH_N] = n
            sh[SH_FLAGS] = flags
            sh[SH_OP] = st[S_OP]
            sh[SH_DIV] = nranks if st[S_OP] == OP_AVG else 1
            if st[S_OP] != OP_AVG:
                sh[SH_FLAGS] = flags & ~F_POSTDIV
            sh[SH_SLOT_IN] = mine + CONN_HEADER + remainder(st[S_RECVD], nslots) * slot_bytes
            sh[SH_USER_IN] = st[S_SEND] + in_first * itemsize
            sh[SH_SLOT_OUT] = nxt + CONN_HEADER + remainder(st[S_SENT], nslots) * slot_bytes
            if st[S_KIND] == KIND_ALL_TO_ALLV and flags & F_SEND:   # the part's length
                store_volatile(sh[SH_SLOT_OUT] + slot_bytes - SPLIT_TRAILER_BYTES, n)
            sh[SH_USER_OUT] = st[S_RECV] + out_first * itemsize
            if flags & F_ALL:
                _lane_addrs(addrs, flags, sh[SH_USER_IN], peers, mine, rank, nranks, conn,
                            block, nblocks, conn_stride, slot_bytes,
                            remainder(st[S_SENT] if flags & F_SEND else st[S_RECVD], nslots))
            st[S_FLAGS] = flags
            sh[SH_CMD] = CMD_MOVE
            return

    @cuda.jit(device=True)
    def post_step(st, ctl, peers, rank, nranks, block, nblocks, conn_stride):
        """Thread 0, after the block moved a step: publish it to the step's peers (their
        connectors, found by ``schedule``; an ``F_ALL`` step's in every other rank, its
        lane in each)."""
        flags = st[S_FLAGS]
        # A collective's slot counters count its sends and receives on a connector. An
        # all_to_all sends and receives once per loop on each of its connector sets, so its
        # counters count loops and advance when a loop ends (``Collective.loop_counted``).
        per_loop = loop_counted(st[S_KIND])
        if flags & (F_SEND | F_RECV):   # the block's data (ordered by the barrier), then
            fence(st[S_LOCAL])           # the flags; a copy publishes none
        if flags & F_ALL:     # lane k - 1 of rank r + k (a send) or r - k (a receive); lane
            #                     0, of the next and previous ranks, is the ring's, below
            for k in range(2, nranks):
                if flags & F_SEND:
                    to = _conn(peers[ring_index(rank + k, nranks)], st[S_CONN], block,
                               nblocks, conn_stride)
                    store_volatile(to + CONN_TAIL + 8 * (k - 1), st[S_SENT] + 1)
                else:
                    back = _conn(peers[ring_index(rank - k + nranks, nranks)], st[S_CONN],
                                 block, nblocks, conn_stride)
                    store_volatile(back + CONN_HEAD + 8 * (k - 1), st[S_RECVD] + 1)
        if flags & F_SEND:
            store_volatile(st[S_TO_CONN] + CONN_TAIL, st[S_SENT] + 1)
            if not per_loop:
                st[S_SENT] += 1
        if flags & F_RECV:
            store_volatile(st[S_FROM_CONN] + CONN_HEAD, st[S_RECVD] + 1)
            if not per_loop:
                st[S_RECVD] += 1
        st[S_STEP] += 1
        if st[S_STEP] == steps_per_loop(st[S_KIND], nranks):
            st[S_STEP] = 0
            st[S_LOOP] += 1
            if per_loop:
                st[S_SENT] += 1
                st[S_RECVD] += 1
        st[S_PROGRESS] += 1
        if st[S_PROGRESS] % PROGRESS_EVERY == 0:
            store_volatile(_status(ctl, block) + BS_PROGRESS, st[S_PROGRESS])

    @cuda.jit(device=True)
    def start(st, act, akey, sh, params, ctl, pool, tasks, block):
        """Thread 0 at launch: rebuild the sorted task list from the saved contexts and
        counters (device memory: a launch of many blocks reading host memory would queue
        its reads one behind another)."""
        for i in range(S_WORDS):
            st[i] = 0
        st[S_CUR] = -1
        st[S_IDLE_SINCE] = now_ns()
        st[S_LOCAL] = load_volatile(pool + P_PEERS_LOCAL)
        st[S_FRONTIER] = load_volatile(pool + P_SQ_FRONTIER + block * 8)
        counts = pool + P_COUNTS + block * BC_SIZE
        st[S_COMPLETED] = load_volatile(counts + BC_COMPLETED)
        st[S_PREEMPTIONS] = load_volatile(counts + BC_PREEMPTIONS)
        st[S_PROGRESS] = load_volatile(counts + BC_PROGRESS)
        st[S_EXITS] = load_volatile(counts + BC_EXITS)
        st[S_TRACE_HEAD] = load_volatile(pool + P_TRACE_HEAD + block * 8)
        st[S_QUITS0] = load_volatile(pool + P_BLOCK_QUITS)   # blocks start together; none
        #                                                       quits within QUIT_AFTER
        _trace(st, pool, block, EV_LAUNCHED, -1, sm_id(), 0, 0)   # where the block runs
        sh[SH_NACT] = 0
        for coll in range(MAX_COLLS):
            task = coll * TASK_WORDS
            if tasks[task + T_ACTIVE] != 0:
                _insert(act, akey, sh, coll, order_key(params, tasks[task + T_PRIO],
                                                       tasks[task + T_SEQ], coll))

    @daemon_kernel(policy, register_cap(nthreads), "profile" if PROFILE_STEPS else "")
    def daemon(ctl, pool, peers_addr, rank, nranks, nslots, slot_bytes, conn_stride, limit):
        block = cuda.blockIdx.x
        nblocks = cuda.gridDim.x
        tid = cuda.threadIdx.x
        sh = cuda.shared.array(SH_WORDS, np.int64)
        addrs = cuda.shared.array(ADDR_WORDS, np.int64)    # an F_ALL step's (_lane_addrs)
        act = cuda.shared.array(MAX_COLLS, np.int64)
        akey = cuda.shared.array(MAX_COLLS, np.int64)
        prof = cuda.shared.array(PROFILE_SHARED_WORDS, np.int64)
        st = cuda.local.array(S_WORDS, np.int64)
        # The policy's parameters live in host memory, a PCIe round trip per read, and
        # thread 0 reads them at every step: it copies them once per launch (the host sets
        # them before the first launch).
        params = cuda.shared.array(PARAM_SLOTS, np.int64)
        peers = as_array(peers_addr, nranks, np.int64)
        colls = as_array(pool + P_COLLS, MAX_COLLS * COLL_WORDS, np.int64)
        tasks = as_array(pool + P_TASKS + block * MAX_COLLS * TASK_WORDS * 8,
                         MAX_COLLS * TASK_WORDS, np.int64)
        queue = as_array(pool + P_QUEUE + block * MAX_COLLS * (RUNS - 1) * QUEUE_WORDS * 8,
                         MAX_COLLS * (RUNS - 1) * QUEUE_WORDS, np.int64)
        if tid == 0:
            for i in range(PARAM_SLOTS):
                params[i] = load_volatile(pool + P_PARAMS + i * 8)
            start(st, act, akey, sh, params, ctl, pool, tasks, block)
            step_profile.begin(prof)
        cuda.syncthreads()
        while True:
            if tid == 0:
                schedule(st, act, akey, sh, addrs, params, ctl, pool, colls, tasks, queue,
                         peers, rank, nranks, nslots, slot_bytes, conn_stride, block, nblocks,
                         limit, prof)
                lap(prof, step_profile.PH_ISSUE)
            cuda.syncthreads()
            if PROFILE_STEPS and tid == 0:
                lap(prof, step_profile.PH_BARRIER_IN)
            cmd = sh[SH_CMD]
            if cmd == CMD_EXIT:
                break
            if sh[SH_FLAGS] & F_ALL:
                move_all(sh[SH_DTYPE], sh[SH_N], sh[SH_FLAGS], sh[SH_OP], sh[SH_DIV],
                         sh[SH_USER_IN], addrs, nranks, sh[SH_USER_OUT])
            else:
                move(sh[SH_DTYPE], sh[SH_N], sh[SH_FLAGS], sh[SH_OP], sh[SH_DIV],
                     sh[SH_SLOT_IN], sh[SH_USER_IN], sh[SH_SLOT_OUT], sh[SH_USER_OUT])
            if PROFILE_STEPS and tid == 0:
                lap(prof, step_profile.PH_MOVE)
            cuda.syncthreads()
            if tid == 0:
                lap(prof, step_profile.PH_BARRIER_OUT)
                post_step(st, ctl, peers, rank, nranks, block, nblocks, conn_stride)
                lap(prof, step_profile.PH_POST)
                step_profile.count_step(prof)
        if tid == 0:
            step_profile.flush(prof, pool + P_STEP_PHASES)
            _publish_cq(st, sh, ctl)
            atomic_add_gpu(pool + P_BLOCK_QUITS, 1)
            _trace(st, pool, block, EV_QUIT, -1, 0, 0, 0)
            counts = pool + P_COUNTS + block * BC_SIZE    # for the next launch
            store_volatile(counts + BC_COMPLETED, st[S_COMPLETED])
            store_volatile(counts + BC_PREEMPTIONS, st[S_PREEMPTIONS])
            store_volatile(counts + BC_PROGRESS, st[S_PROGRESS])
            store_volatile(counts + BC_EXITS, st[S_EXITS] + 1)
            status = _status(ctl, block)
            store_volatile(status + BS_PROGRESS, st[S_PROGRESS])
            store_volatile(status + BS_EXITS, st[S_EXITS] + 1)

    return daemon


def compile_now(kernel) -> None:
    """Compile (or load from the disk cache) the daemon's one specialization and load it
    into the current context. Loading it once, here, matters: numba-cuda's table of loaded
    modules is not safe for two rank threads that launch a new kernel at the same moment
    (``AssertionError: key already in dictionary: <CUlibrary>``)."""
    if hasattr(kernel, "compile"):    # the simulator's kernels run as Python
        kernel.compile(DAEMON_SIGNATURE).bind()
