"""Timed loops without Python's cyclic garbage collector, as ``timeit`` times code.

A full collection in a process that has compiled the daemon walks every object Numba made
(about 100,000 on import alone: 54 ms on a 2-core machine). A
pause that long, in the middle of a benchmark, stops the thread that submits and completes
runs; the daemons, idle past their quit budget (5 ms), quit and must be relaunched, and the
size being measured pays for both. The benchmarks measure the collectives, not the
collector, so their timed loops run inside ``gc_paused()``. Rank threads of one process
share the collector: it stays off until the last of them leaves.
"""

from __future__ import annotations

import contextlib
import gc
import threading

__all__ = ["gc_paused"]

_lock = threading.Lock()
_inside = 0            # threads inside gc_paused()
_was_enabled = False   # the collector's state when the first of them entered


@contextlib.contextmanager
def gc_paused():
    """Collect once, then keep the collector off until every thread inside has left."""
    global _inside, _was_enabled
    with _lock:
        if _inside == 0:
            _was_enabled = gc.isenabled()
            gc.collect()
            gc.disable()
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0 and _was_enabled:
                gc.enable()
