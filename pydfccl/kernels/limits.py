"""How wide a daemon block may be and how many fit on a multiprocessor: numbers the
compiler caps registers by and the host sizes a job by.

Plain Python, importable without Numba: a process that only starts rank processes sizes
their world with these and needs nothing else of the kernels.
"""

from __future__ import annotations

__all__ = ["MAX_THREADS", "SM_REGISTERS", "register_cap", "blocks_per_sm"]

MAX_THREADS = 512                         # threads per daemon block, at most
SM_REGISTERS = 65536                      # a multiprocessor's register file (sm_90)


def register_cap(nthreads: int) -> int:
    """The registers a daemon thread may use in blocks of ``nthreads``: an SM's file
    (65,536) shared by one full block, in the 8-register steps a warp is given them, 255 at
    most (the instruction set's limit)."""
    return min(255, SM_REGISTERS // max(1, nthreads) // 8 * 8)


def blocks_per_sm(nthreads: int) -> int:
    """Daemon blocks of ``nthreads`` one multiprocessor holds at once: its registers over a
    block's (whole warps at ``register_cap``); one for 256 threads and more."""
    warps_threads = -(-nthreads // 32) * 32
    return max(1, SM_REGISTERS // (warps_threads * register_cap(nthreads)))
