"""One fresh process of ``bench startup``: a 2-rank program that prepares one all-reduce,
starts and verifies its first result, with each phase timed; prints one JSON line.

Run by ``pydfccl.cli.startup`` as ``PROBE`` (``python -c``: ``python -m`` would import the
package before the probe could time it) with POLICY and COUNT as arguments; the kernel cache
it uses is the environment's (``PYDFCCL_CACHE_DIR``)."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

__all__ = ["PROBE", "CONTEXT_PROBE", "first_collective", "sources_without_byte_code", "main"]

# A bare process that only starts the CUDA driver and makes the GPU's primary context (with
# the environment's work queues): the part of a start that no import or launcher can take off.
# Prints the wall-clock time at which the context was made, or null without a driver.
CONTEXT_PROBE = """
import ctypes, time
try:
    lib = ctypes.CDLL("libcuda.so.1")
except OSError:
    lib = None
device, context = ctypes.c_int(0), ctypes.c_void_p()
made = (lib is not None and lib.cuInit(0) == 0
        and lib.cuDeviceGet(ctypes.byref(device), 0) == 0
        and lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0)
print(repr(time.time()) if made else "null")
"""

PROBE = ("import sys, time; t = time.perf_counter(); import pydfccl; "
         "t = time.perf_counter() - t; from pydfccl.cli.startup_probe import main; "
         "sys.exit(main(sys.argv[1:], t))")


def first_collective(comm, count: int) -> dict:
    """A rank's part: prepare and start, then one all-reduce whose result is checked. The
    wall-clock times (``time.time()``) at which it began and had its result verified let
    the parent time the process from its start to the result."""
    import numpy as np

    began = time.time()
    t0 = time.perf_counter()
    comm.prepare(0, "all_reduce", count=count, dtype="float32")
    comm.start()
    t1 = time.perf_counter()
    x = comm.empty(count, "float32")
    x[...] = comm.rank + 1
    comm.run(0, x).result(timeout=300)
    got = np.asarray(x)
    expected = comm.nranks * (comm.nranks + 1) / 2
    t2 = time.perf_counter()
    return dict(began=began, start=t1 - t0, first=t2 - t1, verified_at=time.time(),
                ok=bool(np.all(got == expected)))


def sources_without_byte_code(modules=None) -> dict[str, int]:
    """How many imported modules, by top-level package, have no cached byte code: every
    process compiles their source again, a start-up cost that pip's install avoids by
    writing the byte code, and that PYTHONDONTWRITEBYTECODE or a read-only package directory
    keeps Python from avoiding later."""
    counts: dict[str, int] = {}
    for name, module in list((sys.modules if modules is None else modules).items()):
        source = getattr(module, "__file__", None)
        if not source or not source.endswith(".py"):
            continue
        if not os.path.exists(importlib.util.cache_from_source(source)):
            top = name.partition(".")[0]
            counts[top] = counts.get(top, 0) + 1
    return counts


def main(argv: list[str], import_seconds: float) -> int:
    """The phases after ``import pydfccl``, which took ``import_seconds``."""
    import pydfccl
    from pydfccl import cuda_start

    policy, count = argv[0], int(argv[1])
    phases = {"import pydfccl": import_seconds}

    t = time.perf_counter()
    cuda_start.begin()     # as launch() does: the driver and context beside the imports
    from pydfccl import platform   # Numba's CUDA target, and the backend
    from pydfccl.host.daemons import daemon_for
    from pydfccl.host.world_config import WorldConfig
    phases["runtime modules (numba.cuda)"] = time.perf_counter() - t

    t = time.perf_counter()
    platform.backend.open_context()
    phases["CUDA context, after the imports"] = time.perf_counter() - t

    t = time.perf_counter()
    daemon_for(pydfccl.get_policy(policy), WorldConfig(nranks=2).nthreads)
    phases["daemon compile or load"] = time.perf_counter() - t

    launched = time.time()
    ranks = pydfccl.launch(first_collective, 2, policy=policy, args=(count,), timeout=600)
    ended = time.time()
    verified_at = max(r["verified_at"] for r in ranks)
    phases["ranks up"] = max(r["began"] for r in ranks) - launched
    phases["prepare + start"] = max(r["start"] for r in ranks)
    phases["first verified collective"] = max(r["first"] for r in ranks)
    phases["ranks down"] = ended - verified_at
    print(json.dumps(dict(phases=phases, verified_at=verified_at,
                          context_beside_imports=cuda_start.background_seconds(),
                          ok=all(r["ok"] for r in ranks),
                          uncompiled=sources_without_byte_code(),
                          backend=pydfccl.platform.backend.name)))
    return 0
