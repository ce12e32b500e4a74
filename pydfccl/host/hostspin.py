"""Waiting for a completion without holding the GIL.

A thread blocked in ``Future.result()`` learns of its collective's completion by watching
the next completion-queue stamp. Watching it from Python means sleeping between looks
(microseconds each, and the GIL taken back every time), which with several rank threads in
one process turns into GIL hand-offs that cost far more than the collective. This compiled
loop watches the stamp with atomic loads and no GIL, so the other ranks' threads run while
it waits and the waiter sees the stamp within a few hundred nanoseconds.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["wait_for_stamp", "wait_for_any_stamp", "warm_up", "SPINS_PER_CALL"]

# One look is a few nanoseconds; a call returns after about this many looks (tens of
# microseconds) so that the caller can check timeouts and errors in Python.
SPINS_PER_CALL = 20_000


@intrinsic
def _load_acquire_i64(typingctx, addr):
    """An acquire load of the int64 at ``addr`` (the compiler may not hoist it out of a
    loop, and it sees the daemon's release store of the stamp with what came before)."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], ir.PointerType(ir.IntType(64)))
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(types.int64), codegen


@njit(nogil=True, cache=True)
def wait_for_stamp(addr, want, spins):
    """Watch the int64 at ``addr`` until it is at least ``want`` or ``spins`` looks have
    passed; return whether it got there."""
    for _ in range(spins):
        if _load_acquire_i64(addr) >= want:
            return True
    return False


@njit(nogil=True, cache=True)
def wait_for_any_stamp(addrs, wants, spins):
    """Watch several int64s at once; return the index of the first that reached its
    ``wants`` entry, or -1 after ``spins`` rounds."""
    for _ in range(spins):
        for i in range(addrs.size):
            if _load_acquire_i64(addrs[i]) >= wants[i]:
                return i
    return -1


def warm_up() -> None:
    """Load both loops now, with the argument types their callers pass. Numba's first call
    of a function in a process takes 0.4 to 0.7 s even from its disk cache, and it came in
    the first ``result()``: in a traced demo on the H200 every rank's daemon had completed
    its first iteration's runs within 4 to 11 ms, and the host had the results after
    350 ms."""
    word = np.zeros(1, np.int64)
    wait_for_stamp(word.ctypes.data, 0, 1)
    wait_for_any_stamp(np.array([word.ctypes.data], np.int64), np.zeros(1, np.int64), 1)
