"""A rank's blocks share their reads of host memory, which queue behind one another on the
H200 (layout.py): the SQ's turn and the abort word, checked by calling the
two device functions that do it in a simulator process."""


SCRIPT = r"""
import json
import time

import numpy as np

from pydfccl.protocol import layout as L
from pydfccl.kernels import daemon as D
from pydfccl.kernels import primitives as P

SECOND = 1_000_000_000
now = time.perf_counter_ns     # the simulator's %globaltimer
out = {}


def words(n):
    arr = np.zeros(n, np.int64)
    return arr, arr.ctypes.data


# The abort word: read at the rank's turn, then remembered in device memory.
host, host_addr = words(1)
seen, seen_addr = words(2)     # the pool's abort flag, then when the next look is due
host[0] = 1
seen[1] = now() + SECOND
out["not_its_turn"] = P.abort_seen(host_addr, seen_addr)
seen[1] = 0
out["its_turn"] = P.abort_seen(host_addr, seen_addr)
out["shared"] = int(seen[0])
host[0] = 0
out["remembered"] = P.abort_seen(host_addr, seen_addr)
seen[:] = 0
t = now()
out["no_abort"] = P.abort_seen(host_addr, seen_addr)
out["next_look_after_ns"] = int(seen[1] - t)

# The SQ's turn: one block of the rank at a time, idle blocks first.
pool, base = words(L.P_SQ_NEXT_POLL // 8 + 1)
turn = L.P_SQ_NEXT_POLL // 8
out["first"] = D._sq_turn(base, False)
out["held_for_ns"] = int(pool[turn] - now())
out["while_held"] = [D._sq_turn(base, False), D._sq_turn(base, True)]
D.SQ_POLL_BUSY_NS = SECOND          # (a simulated call takes longer than the real 5 us)
pool[turn] = now() - 1_000          # the read is over and the turn due
out["busy_when_due"] = D._sq_turn(base, True)
out["idle_when_due"] = D._sq_turn(base, False)
pool[turn] = now() - 2 * SECOND
out["busy_when_long_overdue"] = D._sq_turn(base, True)
print(json.dumps(out))
"""


def test_a_ranks_blocks_share_their_host_reads(simulated_report):
    r = simulated_report(SCRIPT)
    # the abort word
    assert r["not_its_turn"] is False             # set, but no read before the rank's turn
    assert r["its_turn"] is True and r["shared"] == 1
    assert r["remembered"] is True                # from device memory once seen
    assert r["no_abort"] is False and r["next_look_after_ns"] > 50_000   # ABORT_LOOK_NS
    # the SQ
    assert r["first"] is True and r["held_for_ns"] > 100_000   # held while it reads
    assert r["while_held"] == [False, False]
    assert r["busy_when_due"] is False and r["idle_when_due"] is True
    assert r["busy_when_long_overdue"] is True
