"""How a daemon kernel is compiled: a register cap and a disk-cache key that outlive the process.

Two things that plain ``cuda.jit(cache=True)`` gets wrong for the daemon:

* **The cache never hit.** The daemon is a closure over the policy's compiled functions, and
  Numba keys a closure's cache entry by pickling its cells; a pickled dispatcher carries a
  fresh uuid in every process, so each run compiled the daemon again (12 s on an H200).
  Here the key is the source of the kernels and the
  policy's functions instead, which is what the machine code depends on.
* **A policy could exhaust the registers.** Compiled with the ``nccl`` policy's constants the
  daemon took more than 128 registers per thread and could not launch 512 threads
  (``CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES``). The cap (``limits.register_cap``) follows the
  block's width: 128 for 512 threads, which makes every policy launchable, and more for
  narrower blocks, so that thread 0's scheduler keeps its state in registers. Under the
  128 cap ptxas spills (CUDA 13.5's nvJitLink for sm_90, the dfccl daemon: a
  248-byte stack frame, 630 bytes of spill stores and 772 of loads; 256, 634 and 780 before
  ``divide.py``; at 168, 80 and 48; uncapped it takes 222 registers and spills nothing).

The simulator runs kernels as Python and takes neither option; this module is the only
place that knows.
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

from numba import cuda

from .memory import SIMULATOR

__all__ = ["daemon_kernel", "cache_key", "fingerprint"]

_PACKAGE = Path(__file__).resolve().parent.parent
# The files whose text becomes the daemon's machine code: the kernels and every module of
# the package they import, whose constants (kind codes, step counts, parameter slots, the
# preempted mark) are compiled in. The kernels' host-side modules that only compile, cache
# or inspect are left out, and so is the lookup of policies by name. A test walks the
# kernels' imports and fails on a module that is neither here nor left out.
_HOST_ONLY = {"ahead.py", "cache_place.py", "kernel_cache.py", "ptx.py", "shipped.py"}
_NOT_COMPILED = {"sched/plugins.py"}
_SOURCES = sorted(p for p in _PACKAGE.glob("kernels/*.py") if p.name not in _HOST_ONLY) + [
    _PACKAGE / name for name in ("protocol/collectives.py", "protocol/codes.py",
                                 "protocol/layout.py", "sched/params.py", "sched/policies.py",
                                 "sched/signatures.py", "sched/slots.py")]


def _function_text(fn) -> str:
    """A policy function's source and the numbers it reads from its module."""
    names = fn.__code__.co_names
    constants = {name: fn.__globals__[name] for name in names
                 if isinstance(fn.__globals__.get(name), (bool, int, float))}
    return inspect.getsource(fn) + repr(sorted(constants.items()))


def fingerprint(policy) -> str:
    """What a policy's daemon is compiled from, as one hash that is the same in every process."""
    digest = hashlib.sha256(policy.name.encode())
    for path in _SOURCES:
        digest.update(path.read_bytes())
    for fn in policy.functions:
        digest.update(_function_text(fn).encode())
    return digest.hexdigest()


def cache_key(policy, registers: int, variant: str = "") -> str:
    """The disk-cache key of ``policy``'s daemon with ``registers`` a thread: the content of
    its sources (never their paths or times), so that it survives reinstalling."""
    return f"{fingerprint(policy)}-r{registers}{variant}"


if SIMULATOR:
    def daemon_kernel(policy, registers: int, variant: str = ""):
        """The simulator's kernel decorator (it caches and caps nothing)."""
        return cuda.jit
else:
    from .kernel_cache import KeyedCache

    def daemon_kernel(policy, registers: int, variant: str = ""):
        """``cuda.jit`` for ``policy``'s daemon with at most ``registers`` a thread, cached
        across processes and installs (a build ``variant``, such as the step profile, apart)."""
        key = cache_key(policy, registers, variant)

        def decorate(fn):
            kernel = cuda.jit(max_registers=registers)(fn)
            kernel._cache = KeyedCache(kernel.py_func, key)
            return kernel
        return decorate
