"""Fixed-layout records shared by the host and the daemon kernel.

Each record is a numpy structured dtype with explicit padding; the kernel reads and writes
64-bit words at offsets derived here from the same dtypes, so the two sides cannot drift.

Two regions per rank:

* the *control row*, in memory both the host and the GPU can reach (mapped pinned memory,
  or shared memory under the simulator): the submission queue (SQ), the completion queue
  (CQ), the abort and hold words and per-block status and statistics;
* the *pool*, in device memory that peers can reach: the collective table, the policy's
  parameters, the saved task contexts and counters, each block's event log, and the
  connectors (slot buffers with head/tail counters) through which the previous rank in the
  ring sends data to this one.

The daemon reads host memory as little as it can: on the H200 reads of it queue behind one
another. One read took 1.25 us alone, 38.5 us while 32 other blocks each kept a read of one
host word in flight, and 133 us with 128: about 1.2 us for each of those reads. So one
block's reads can delay every other block's, busy blocks' too.
"""

import numpy as np

__all__ = [
    "MAX_COLLS", "MAX_BLOCKS", "RUNS_IN_FLIGHT", "SQ_CAP", "CQ_CAP", "NO_LIMIT", "TRACE_CAP",
    "REQUEST_CAP", "GRANT_CAP", "LATE_CAP",
    "TRACE_KINDS", "BLOCK_STATUS", "SQ_ENTRY", "CQ_ENTRY", "REGISTRATION", "CTL_ROW",
    "COLL_ENTRY", "TASK", "SQ_COPY", "QUEUED_RUN", "BLOCK_COUNTS", "TRACE_EVENT",
    "POOL_HEADER",
    "CONN_HEADER_BYTES", "CONN_LANES", "conn_bytes", "pool_bytes", "word",
    "STEP_WORD_STEPS", "pack_step", "unpack_step",
]

MAX_COLLS = 128   # prepared collectives per communicator (bounds a shared-memory list)
MAX_BLOCKS = 32   # daemon blocks (channels) per rank
RUNS_IN_FLIGHT = 8   # runs of one collective submitted and not yet completed, at most: a
#                      block queues the runs behind its active one (QUEUED_RUN), so back-to-
#                      back runs need no host round trip between them
SQ_CAP = MAX_COLLS * RUNS_IN_FLIGHT   # every run in flight fits: the SQ never overflows,
CQ_CAP = SQ_CAP                       # and neither does the CQ
NO_LIMIT = 1 << 62   # the daemon's ``limit`` argument when it may take every SQ entry
REQUEST_CAP = 1024   # a rank's runs of shared-slot collectives asked for and not yet read
#                      by the slot leader (host/slots.py); more wait on the rank's host
GRANT_CAP = 1024     # grants the slot leader made that a rank has not yet read, at most
LATE_CAP = 64        # a rank's late registrations of shared-slot collectives not yet read
#                      by the slot leader; more wait on the rank's host

I8 = "<i8"

# Where a block is in a task, as one word (its status row's ``step``, an event's
# ``detail``): loop * STEP_WORD_STEPS + step. A loop has at most 2n - 1 steps on n ranks.
STEP_WORD_STEPS = 1024


# ``BLOCK_STATUS.fault``: collective index + 1, plus the sender's rank times this
FAULT_RANK = 1 << 20


def pack_step(loop, step):
    """The step word of ``step`` in ``loop`` (the daemon compiles this same function)."""
    return loop * STEP_WORD_STEPS + step


def unpack_step(word: int) -> tuple[int, int]:
    """(loop, step) of a step word."""
    return word // STEP_WORD_STEPS, word % STEP_WORD_STEPS


BLOCK_STATUS = np.dtype([
    ("fault", I8),         # an all_to_allv's counts that a pair disagrees on: the
    #                        collective + 1 + FAULT_RANK * the sending rank (0: none)
    ("coll", I8),          # collective last loaded + 1, until it completes (0: none)
    ("step", I8),          # where it is in it: pack_step(loop, step)
    ("waits", I8),         # 1: waits for data from prev, 2: for slot credit from next
    ("completed", I8),
    ("preemptions", I8),
    ("exits", I8),         # launches of this block that ended
    ("progress", I8),      # steps done, ever (the watchdog's heartbeat)
])

# The daemon reads an entry's seq, then (coll, send) and (recv, priority) as two 16-byte
# loads that cross PCIe together (the asserts below keep the pairs aligned).
SQ_ENTRY = np.dtype([
    ("seq", I8),           # written last by the host: submission number + 1
    ("pad", I8),
    ("coll", I8),
    ("send", I8),
    ("recv", I8),
    ("priority", I8),
    ("pad2", I8, 2),
])

CQ_ENTRY = np.dtype([
    ("stamp", I8),         # written last by the GPU: completion number + 1
    ("coll", I8),
])

REGISTRATION = np.dtype([  # a collective prepared after start(), published for the peers
    ("published", I8),     # 1 once the fields below are written
    ("coll_id", I8),
    ("kind", I8),
    ("dtype", I8),
    ("op", I8),
    ("count", I8),
    ("root", I8),          # send and recv: the peer
    ("one_shot", I8),      # 1: an all_reduce this rank runs one-shot (kernels/plans.py)
])

CTL_ROW = np.dtype([
    ("abort", I8),
    ("host_blocked", I8),  # 1 while this rank's host is blocked in a device synchronize
    ("host_submitted", I8),
    ("host_completed", I8),
    ("heartbeat", I8),     # the host's CLOCK_MONOTONIC in ns, refreshed by the poller;
    #                        -1 once the communicator closed, 0 before it started
    ("pid", I8),           # the host process (host.liveness): its peers see it die at once
    ("pid_start", I8),     # its start time in clock ticks (a reused pid is not it)
    ("pid_ns", I8),        # its pid namespace: a pid means this process only in the same one
    ("blocks", BLOCK_STATUS, MAX_BLOCKS),
    ("sq", SQ_ENTRY, SQ_CAP),
    ("cq", CQ_ENTRY, CQ_CAP),
    ("registered", REGISTRATION, MAX_COLLS),   # by daemon index; only the host reads it
    # Shared slots (host/slots.py, host/shared_slots.py), hosts only. This rank's requests:
    ("req_head", I8),      # runs asked for, ever (written by this rank's host)
    ("req_seen", I8),      # of those, read by the slot leader (written by the leader)
    ("grant_seen", I8),    # the leader's grants this rank has read
    ("grant_head", I8),    # the leader's grants, ever (read in rank 0's row only)
    ("late_head", I8),     # late registrations of shared-slot collectives, ever
    ("late_seen", I8),     # of those, read by the slot leader (written by the leader)
    ("row_sent", I8),      # a replica (a rank on another node): when its newest row applied
    #                        here left that rank, on its clock (transport/rows.py)
    ("pad_req", I8),
    ("req", I8, REQUEST_CAP),        # the coll_id of request k at k % REQUEST_CAP
    ("late", REGISTRATION, LATE_CAP),   # late registration k at k % LATE_CAP
    ("slot_done", I8, MAX_COLLS),    # runs this rank completed in each slot, ever
    ("slot_reset", I8, MAX_COLLS),   # the binding epoch this rank reset each slot for
    # The leader's bindings (read in rank 0's row only): per slot an epoch, odd while the
    # leader rewrites the binding, and the coll_id bound (-1: none, -2: a companion slot of
    # an all_to_all); and its grants in the order made: grant k at k % GRANT_CAP, runs in
    # the slot's binding of that epoch.
    ("bind_epoch", I8, MAX_COLLS),
    ("bind_coll", I8, MAX_COLLS),
    ("grant_slot", I8, GRANT_CAP),
    ("grant_epoch", I8, GRANT_CAP),
    ("grant_runs", I8, GRANT_CAP),
])

COLL_ENTRY = np.dtype([
    ("kind", I8),
    ("dtype", I8),
    ("op", I8),
    ("count", I8),
    ("root", I8),       # broadcast and reduce: the root; send and recv: the peer
    ("nchannels", I8),
    ("itemsize", I8),
    ("conn", I8),       # its first connector set (all_to_all uses nranks - 1 of them)
])

TASK = np.dtype([          # the saved context of one collective on one block
    ("active", I8),
    ("seq", I8),
    ("send", I8),
    ("recv", I8),
    ("step", I8),          # step within the current loop
    ("loop", I8),
    ("tries", I8),         # loads of this run (stickiness)
    ("sent", I8),          # slots sent on this connector, ever
    ("recvd", I8),         # slots received on this connector, ever
    ("priority", I8),
    ("runs", I8),          # runs of this collective this block has finished, ever
    ("queued", I8),        # runs queued behind the active one (QUEUED_RUN), ever
    ("dequeued", I8),      # of those, runs taken from the queue, ever
    ("memo", I8),          # the policy's word for this run (its ``remember``), from 0
    ("pad", I8, 2),
])

SQ_COPY = np.dtype([       # an SQ entry as the first block of the rank to read it copied it
    ("coll", I8),          # into device memory, for its siblings (the pool's ``sq_copy``)
    ("send", I8),
    ("recv", I8),
    ("priority", I8),
])

QUEUED_RUN = np.dtype([    # a run absorbed while another run of its collective was active
    ("seq", I8),
    ("send", I8),
    ("recv", I8),
    ("priority", I8),
])

BLOCK_COUNTS = np.dtype([  # a block's counters across launches, in device memory: a launch
    ("completed", I8),     # starts from them without reading host memory (its status row)
    ("preemptions", I8),
    ("progress", I8),
    ("exits", I8),
])

TRACE_EVENT = np.dtype([   # one record of a block's event log
    ("t", I8),             # nanoseconds (%globaltimer on a GPU, perf_counter_ns simulated)
    ("event", I8),         # TRACE_KINDS
    ("coll", I8),          # collective index (-1: none)
    ("detail", I8),        # pack_step(loop, step), or the SQ sequence number
    ("waited", I8),        # preempted: nanoseconds the primitive waited before giving up
    ("flags", I8),         # preempted: the primitive (primitives.F_* flags)
])
TRACE_CAP = 4096           # events kept per block; the host drains them every 10 ms
TRACE_KINDS = {1: "absorbed", 2: "loaded", 3: "preempted", 4: "completed", 5: "launched",
               6: "quit"}

POOL_HEADER = np.dtype([
    ("cq_reserve", I8),
    ("pad", I8, 15),
    ("block_quits", I8),      # daemon blocks that have exited, ever (device-side count)
    ("pad2", I8, 15),
    ("rank_progress", I8),    # %globaltimer at this rank's last progress, any block
    ("pad3", I8, 15),
    ("sq_seen", I8),          # the furthest SQ entry a block of this rank has seen
    ("pad4", I8, 15),
    ("sq_next_poll", I8),     # %globaltimer from which a block may read the SQ; the block
    #                           that takes the turn pushes it out until its read is done
    ("pad5", I8, 15),
    ("abort", I8),            # 1 once a block of this rank saw the host's abort word set
    ("abort_next_look", I8),  # %globaltimer from which a block may read that word again
    ("pad6", I8, 14),
    ("params", I8, 8),        # the policy's parameters (the host writes them at start)
    ("peers_local", I8),      # 1 when every peer's memory is on this GPU (GPU-scope fences
    #                           do); the host writes it with the pools
    ("pad7", I8, 7),
    ("step_phases", I8, 16),  # cycles in each phase of a step, summed over blocks, in a
    #                           daemon built with PYDFCCL_PROFILE_STEPS=1 (step_profile.py)
    ("counts", BLOCK_COUNTS, MAX_BLOCKS),   # each block's counters, saved when it exits
    ("sq_copy", SQ_COPY, SQ_CAP),   # the SQ entries below sq_seen, in device memory
    ("done", I8, (MAX_COLLS, RUNS_IN_FLIGHT)),   # blocks that finished each collective's
    #                                              runs, ever, by run number modulo
    ("colls", COLL_ENTRY, MAX_COLLS),
    ("sq_frontier", I8, MAX_BLOCKS),
    ("trace_head", I8, MAX_BLOCKS),   # events each block has written, ever
    ("tasks", TASK, (MAX_BLOCKS, MAX_COLLS)),
    ("queue", QUEUED_RUN, (MAX_BLOCKS, MAX_COLLS, RUNS_IN_FLIGHT - 1)),
    ("trace", TRACE_EVENT, (MAX_BLOCKS, TRACE_CAP)),
], align=True)

CONN_HEADER_BYTES = 256    # tail words, then head words 128 bytes later (separate lines)
CONN_TAIL = 0
CONN_HEAD = 128
# A connector has one sender and one tail and head word, except under a one-shot
# all_reduce (kernels/plans.py): there the sender at distance k uses lane k - 1, the tail
# and head words 8 * (k - 1) bytes on, so a connector takes at most this many senders.
CONN_LANES = 16
HEADER_BYTES = (POOL_HEADER.itemsize + 255) // 256 * 256


def conn_bytes(nslots: int, slot_bytes: int) -> int:
    return CONN_HEADER_BYTES + nslots * slot_bytes


def pool_bytes(max_colls: int, nblocks: int, nslots: int, slot_bytes: int) -> int:
    """Header, then ``max_colls`` connector sets (one per block each); a collective uses
    one set, an all_to_all one per peer."""
    return HEADER_BYTES + max_colls * nblocks * conn_bytes(nslots, slot_bytes)


def word(dtype: np.dtype, *path: str) -> int:
    """Byte offset of a (nested) field: ``word(CTL_ROW, "blocks")``."""
    offset = 0
    for name in path:
        field_dtype, field_offset = dtype.fields[name][:2]
        offset += field_offset
        dtype = field_dtype.base if field_dtype.subdtype else field_dtype
    return offset


# Byte offsets the kernel uses (module-level ints, frozen into the compiled daemon).
CTL_ABORT = word(CTL_ROW, "abort")
CTL_BLOCKS = word(CTL_ROW, "blocks")
CTL_SQ = word(CTL_ROW, "sq")
CTL_CQ = word(CTL_ROW, "cq")
BS_SIZE = BLOCK_STATUS.itemsize
BS = {name: word(BLOCK_STATUS, name) for name in BLOCK_STATUS.names}
SQ_SIZE = SQ_ENTRY.itemsize
SQ_F = {name: word(SQ_ENTRY, name) for name in SQ_ENTRY.names}
CQ_SIZE = CQ_ENTRY.itemsize
CQ_F = {name: word(CQ_ENTRY, name) for name in CQ_ENTRY.names}

P_CQ_RESERVE = word(POOL_HEADER, "cq_reserve")
P_BLOCK_QUITS = word(POOL_HEADER, "block_quits")
P_RANK_PROGRESS = word(POOL_HEADER, "rank_progress")
P_SQ_SEEN = word(POOL_HEADER, "sq_seen")
P_SQ_NEXT_POLL = word(POOL_HEADER, "sq_next_poll")
P_ABORT = word(POOL_HEADER, "abort")
assert word(POOL_HEADER, "abort_next_look") == P_ABORT + 8   # primitives.abort_seen
P_PARAMS = word(POOL_HEADER, "params")
P_PEERS_LOCAL = word(POOL_HEADER, "peers_local")
P_STEP_PHASES = word(POOL_HEADER, "step_phases")
P_COUNTS = word(POOL_HEADER, "counts")
BC_SIZE = BLOCK_COUNTS.itemsize
BC = {name: word(BLOCK_COUNTS, name) for name in BLOCK_COUNTS.names}
P_SQ_COPY = word(POOL_HEADER, "sq_copy")
SQ_COPY_SIZE = SQ_COPY.itemsize
SQ_COPY_F = {name: word(SQ_COPY, name) for name in SQ_COPY.names}
# The daemon moves (coll, send) and (recv, priority) as 16-byte pairs, in the SQ and its copy.
for _fields in (SQ_F, SQ_COPY_F):
    assert _fields["coll"] % 16 == 0 and _fields["send"] == _fields["coll"] + 8
    assert _fields["recv"] % 16 == 0 and _fields["priority"] == _fields["recv"] + 8
assert CTL_ROW.itemsize % 16 == 0 and CTL_SQ % 16 == 0 and SQ_SIZE % 16 == 0
assert P_SQ_COPY % 16 == 0 and SQ_COPY_SIZE % 16 == 0
P_DONE = word(POOL_HEADER, "done")
P_COLLS = word(POOL_HEADER, "colls")
P_SQ_FRONTIER = word(POOL_HEADER, "sq_frontier")
P_TASKS = word(POOL_HEADER, "tasks")
P_QUEUE = word(POOL_HEADER, "queue")
QUEUE_SIZE = QUEUED_RUN.itemsize
P_TRACE_HEAD = word(POOL_HEADER, "trace_head")
P_TRACE = word(POOL_HEADER, "trace")
TRACE_SIZE = TRACE_EVENT.itemsize
COLL_SIZE = COLL_ENTRY.itemsize
COLL_F = {name: word(COLL_ENTRY, name) for name in COLL_ENTRY.names}
TASK_SIZE = TASK.itemsize
TASK_F = {name: word(TASK, name) for name in TASK.names}
QUEUE_F = {name: word(QUEUED_RUN, name) for name in QUEUED_RUN.names}
