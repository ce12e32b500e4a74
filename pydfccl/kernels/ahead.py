"""Compile daemons ahead, without a GPU, into the cache the runtime reads.

libNVVM (the IR to PTX step) and nvJitLink (PTX or LTO-IR to a cubin) run on the CPU; only
asking the device for its compute capability and the CUDA version needs a driver. Here
those answers come from the caller (``cc``), and the kernel is compiled, linked for that
architecture and saved through the daemon's own ``KeyedCache``, under the index key the
runtime computes on a GPU of that capability: the runtime then loads the cubin and compiles
nothing.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

__all__ = ["BuiltDaemon", "build_daemon", "offline_device"]


class _StandInDevice:
    def __init__(self, cc):
        self.compute_capability = cc


@contextlib.contextmanager
def offline_device(cc: tuple[int, int]):
    """Numba's questions to the device answered for compute capability ``cc``: the current
    device, the architecture a library compiles for by default (``sm_90a`` from 9.0 on, as
    Numba chooses on a GPU) and the codegen's part of a cache key."""
    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import runtime

    arch = (cc[0], cc[1], "a" if tuple(cc) >= (9, 0) else "")
    saved = (dispatcher.get_current_device, codegen.CUDACodeLibrary._ensure_cc,
             codegen.JITCUDACodegen.magic_tuple)
    dispatcher.get_current_device = lambda: _StandInDevice(tuple(cc))
    codegen.CUDACodeLibrary._ensure_cc = lambda self, want=None: arch if want is None else want
    codegen.JITCUDACodegen.magic_tuple = lambda self: (runtime.get_version(), tuple(cc))
    try:
        yield arch
    finally:
        (dispatcher.get_current_device, codegen.CUDACodeLibrary._ensure_cc,
         codegen.JITCUDACodegen.magic_tuple) = saved


@dataclass
class BuiltDaemon:
    policy: str
    nthreads: int
    registers: int
    seconds: float
    index_path: str
    cubin_bytes: int
    image: bytes = b""      # the linked cubin
    entry: str = ""         # the kernel's name in it
    key: str = ""           # compiler.cache_key of what it was built from
    nargs: int = 0


def build_daemon(policy_name: str, nthreads: int, cc: tuple[int, int] = (9, 0)) -> BuiltDaemon:
    """Compile ``policy_name``'s daemon for blocks of ``nthreads`` and compute capability
    ``cc``, link its cubin, and save it in the kernel cache (replacing an entry of the same
    key). Needs Numba's CUDA target, not its simulator."""
    from numba.cuda.core import sigutils
    from numba.cuda.dispatcher import _Kernel

    from ..sched.policies import get_policy
    from .compiler import cache_key
    from .daemon import DAEMON_SIGNATURE, make_daemon
    from .limits import register_cap
    from .memory import SIMULATOR

    if SIMULATOR:
        raise RuntimeError("build_daemon compiles for a GPU: set NUMBA_ENABLE_CUDASIM=0")
    start = time.perf_counter()
    policy = get_policy(policy_name)
    dispatcher = make_daemon(policy, nthreads)
    argtypes, _ = sigutils.normalize_signature(DAEMON_SIGNATURE)
    with offline_device(cc) as arch:
        kernel = _Kernel(dispatcher.py_func, argtypes, **dispatcher.targetoptions)
        cubin = kernel._codelibrary.get_cubin(cc=arch)
        dispatcher._cache.save_overload(DAEMON_SIGNATURE, kernel)
    cache = dispatcher._cache
    image = bytes(getattr(cubin, "code", cubin))
    return BuiltDaemon(policy_name, nthreads, register_cap(nthreads),
                       time.perf_counter() - start, cache._cache_file._index_path,
                       len(image), image, kernel.entry_name,
                       cache_key(policy, register_cap(nthreads)), len(argtypes))
