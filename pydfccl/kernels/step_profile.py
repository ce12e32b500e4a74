"""Where a daemon step's time goes: the SM cycles thread 0 spends in each phase of its loop.

A build option for people who tune the daemon, not a counter of every run: with
``PYDFCCL_PROFILE_STEPS=1`` in the environment when pydfccl is imported, the daemon is
compiled (a kernel of its own, cached apart) with a mark between the phases of thread 0's
loop. A mark adds the ``%clock64`` cycles since the previous mark to its phase's counter
in shared memory; a block adds its counters to the pool's ``step_phases`` when it exits.
Without the option every mark compiles to nothing. ``scripts/profile_steps.py`` runs
steps and prints the phases.

The phases, in thread 0's order: ``idle`` (passes with no task), ``sq`` (a read of the
SQ, host memory, that found entries or was made by a block with tasks, and what led to it
in the pass: the CQ, the abort word, the SQ's turn), ``absorb`` (the rest of a pass's
start while there are tasks: taking new runs), ``load`` (a task's context restored),
``retire`` (a finished run: completion, CQ, the next queued run), ``plan`` (the rest up to
the wait: the loop's checks, the step's plan and peers), ``wait`` (the spin for data and
credit, with its acquire fence), ``issue`` (the step's addresses and sizes for the block),
``barrier_in``, ``move`` (thread 0's own share), ``barrier_out``, ``post`` (the release
fence and the peers' counters).
"""

import os

from numba import cuda

from .memory import atomic_add_gpu, clock_cycles

__all__ = ["PROFILE_STEPS", "PHASES", "PROFILE_WORDS", "lap", "count_step", "begin", "flush"]

PROFILE_STEPS = os.environ.get("PYDFCCL_PROFILE_STEPS", "") == "1"
PHASES = ("idle", "sq", "absorb", "load", "retire", "plan", "wait", "issue", "barrier_in",
          "move", "barrier_out", "post")
(PH_IDLE, PH_SQ, PH_ABSORB, PH_LOAD, PH_RETIRE, PH_PLAN, PH_WAIT, PH_ISSUE, PH_BARRIER_IN,
 PH_MOVE, PH_BARRIER_OUT, PH_POST) = range(len(PHASES))
PH_STEPS = len(PHASES)        # steps moved
PH_LAST = PH_STEPS + 1        # the last mark's clock (shared memory only)
PROFILE_WORDS = 16            # the pool's ``step_phases`` (layout.py)
assert PH_LAST < PROFILE_WORDS
SHARED_WORDS = PROFILE_WORDS if PROFILE_STEPS else 1   # a block's shared counters


@cuda.jit(device=True)
def lap(prof, phase):
    """Thread 0: the cycles since the last mark go to ``phase``."""
    if PROFILE_STEPS:
        t = clock_cycles()
        prof[phase] += t - prof[PH_LAST]
        prof[PH_LAST] = t


@cuda.jit(device=True)
def count_step(prof):
    if PROFILE_STEPS:
        prof[PH_STEPS] += 1


@cuda.jit(device=True)
def begin(prof):
    """Thread 0 at launch: counters at zero, the clock from now."""
    if PROFILE_STEPS:
        for i in range(PROFILE_WORDS):
            prof[i] = 0
        prof[PH_LAST] = clock_cycles()


@cuda.jit(device=True)
def flush(prof, addr):
    """Thread 0 at exit: add the block's counters to the pool's at ``addr``."""
    if PROFILE_STEPS:
        for i in range(PH_LAST):
            atomic_add_gpu(addr + 8 * i, prof[i])
