"""Thread 0's scheduler state: one int64 word per field, in a local array of the daemon.

The daemon's device functions update the state in place, so it is an array (``st``), and
each field is a slot of it: ``SLOT[name]`` is the field's index, its place in the dtype.
``daemon.py`` names the slots ``S_<NAME>`` from this table, so a field is added, removed or
reordered here alone. Nothing of it is seen by the host: it lives and dies with a launch
(what outlives one is saved in the task contexts and block counters of ``protocol.layout``).
"""

import numpy as np

__all__ = ["THREAD0_STATE", "SLOT", "S_WORDS"]

I8 = np.int64

THREAD0_STATE = np.dtype([
    # the pass over the block's active tasks
    ("pos", I8),            # place in the sorted task list of the task looked at
    ("cur", I8),            # the collective whose task is loaded (-1: none)
    ("tries_left", I8),     # tries the task at ``pos`` has left in this pass
    ("thresh", I8),         # nanoseconds the next step may wait before a preemption
    ("kind", I8),           # the loaded collective's kind (the table's: plans.ONE_SHOT too)
    ("idle_since", I8),     # %globaltimer at this block's last progress
    ("frontier", I8),       # SQ entries this block has taken
    # the loaded task's context (saved in its task record when switched out)
    ("step", I8),           # step within the loop
    ("loop", I8),           # loop of the block's share
    ("sent", I8),           # slots sent on the collective's connectors
    ("recvd", I8),          # slots received on them
    ("send", I8),           # the run's send buffer (address)
    ("recv", I8),           # the run's receive buffer (address)
    ("split_row", I8),      # an all_to_allv's run: its row of counts (plans.split_step)
    # the loaded collective, from the table and the block's share of it
    ("begin", I8),          # first element of the block's share
    ("end", I8),            # one past its last element
    ("nloops", I8),         # loops that cover the share
    ("slot_elems", I8),     # elements one slot holds
    ("dtype", I8),          # codes.DTYPES
    ("op", I8),             # codes.OPS
    ("itemsize", I8),       # bytes of an element
    ("tries", I8),          # times the task was loaded (the policy's threshold_on_load)
    # the block's counters (kept across launches in the pool's block counters)
    ("completed", I8),      # runs this block finished
    ("preemptions", I8),    # tasks it switched out on a wait
    ("progress", I8),       # steps it moved
    # the step handed to the block, more of the loaded collective, the block's bookkeeping
    ("flags", I8),          # the step's primitive flags (primitives.F_*), for post_step
    ("root", I8),           # root, or peer of a send or recv
    ("count", I8),          # elements, with NCCL's meaning of count
    ("abort_seen", I8),     # %globaltimer of the last look at the abort word
    ("local", I8),          # 1 when every peer's memory is on this GPU (GPU-scope fences)
    ("trace_head", I8),     # records written to the block's event log
    ("conn", I8),           # the collective's first connector set
    ("to_conn", I8),        # the step's next rank's connector (address), for post_step
    ("from_conn", I8),      # the step's previous rank's connector (address)
    ("quits0", I8),         # the pool's block_quits at launch: another block quit if it moved
    ("exits", I8),          # this block's exits, before this launch
    # completions held back (their CQ numbers in shared memory, daemon.SH_CQ_K on)
    ("cq_held", I8),        # how many
    ("cq_since", I8),       # %globaltimer when the first was held
])

SLOT = {name: index for index, name in enumerate(THREAD0_STATE.names)}
S_WORDS = THREAD0_STATE.itemsize // 8
