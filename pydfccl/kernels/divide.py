"""Divisions on the daemon's hot path, in 32 bits whenever the operands fit.

A step's plan, its slot addresses and the block's move divide by values known only at run
time (ranks, slots, element sizes). A 64-bit division is a subroutine of some 70
instructions on the GPU, a 32-bit one a handful, and thread 0 runs its steps alone, so
each division's latency adds to every step (``scripts/probe_step_phases.py``). The
operands are almost always small, so these functions take the 32-bit path when both fit
and fall back to 64 bits otherwise: the same result either way.
"""

import numpy as np
from numba import cuda

__all__ = ["quotient", "remainder"]

_U32 = 0xFFFFFFFF


@cuda.jit(device=True)
def quotient(a, b):
    """``a // b`` for ``a >= 0`` and ``b > 0``."""
    if a <= _U32 and b <= _U32:
        return np.int64(np.uint32(a) // np.uint32(b))
    return a // b


@cuda.jit(device=True)
def remainder(a, b):
    """``a % b`` for ``a >= 0`` and ``b > 0``."""
    if a <= _U32 and b <= _U32:
        return np.int64(np.uint32(a) % np.uint32(b))
    return a % b
