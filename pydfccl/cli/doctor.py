"""``python -m pydfccl doctor``: what this machine offers pydfccl, and what will go wrong.

One line per fact, each found on its own so that one failing query does not hide the rest:
the versions that must fit together (numba-cuda 0.30 cannot compile with numpy 2.5), the
simulator or the GPUs with what the daemons and the rank processes need of them (mapped
host memory, peer access between GPUs, stream memory operations for ``pydfccl.torch``, the
MPS daemon for rank processes sharing a GPU), the launchers, and Numba's kernel cache.
Exit status 0 when nothing stands in the way, 1 when something does.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import sys
import tempfile

from .. import platform
from ..kernels.cache_place import cache_dir

__all__ = ["checks", "find_mpiexec", "kernel_cache_dir", "main"]

OK, NOTE, PROBLEM = "ok", "note", "PROBLEM"


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> list[tuple]:
    numpy_v, cuda_v = _version("numpy"), _version("numba-cuda")
    rows = [(OK, "versions", ", ".join(f"{n} {_version(n) or 'missing'}" for n in
                                       ("pydfccl", "numpy", "numba", "numba-cuda",
                                        "cuda-python")))]
    if numpy_v and cuda_v and cuda_v.startswith("0.30") and \
            tuple(int(x) for x in numpy_v.split(".")[:2]) >= (2, 5):
        rows.append((PROBLEM, "numpy", f"numpy {numpy_v} breaks numba-cuda {cuda_v} "
                     "(no kernel compiles); install numpy<2.5"))
    return rows


def _gpus() -> list[tuple]:
    if not platform.gpu_available():
        return [(NOTE, "device", "no GPU: kernels run on the Numba CUDA simulator, one process "
                 "per rank (slow, for tests and teaching)")]
    from cuda.bindings import driver
    from numba import cuda

    rows = []
    count = len(cuda.gpus)
    for i in range(count):
        gpu = cuda.gpus[i]
        with gpu:
            cc = ".".join(map(str, gpu.compute_capability))
            mapped = platform.device_attribute("CAN_MAP_HOST_MEMORY")
            mem_ops = platform.device_attribute("CAN_USE_64_BIT_STREAM_MEM_OPS")
            rows.append((OK if mapped else PROBLEM, f"GPU {i}",
                         f"{gpu.name.decode() if isinstance(gpu.name, bytes) else gpu.name}, "
                         f"compute capability {cc}; maps host memory: {bool(mapped)}"))
            rows.append((OK if mem_ops else NOTE, f"GPU {i} stream ops",
                         "64-bit stream wait/write (pydfccl.torch orders collectives with "
                         f"torch's streams through them): {bool(mem_ops)}"))
    with cuda.gpus[0]:
        mps = platform.mps_active()
    rows.append((OK if mps else NOTE, "MPS", "active: rank processes on one GPU run side by "
                 "side" if mps else "not active: rank processes that share a GPU take turns "
                 "(start it with `nvidia-cuda-mps-control -d`); threads need no MPS"))
    if count > 1:
        blocked = [(a, b) for a in range(count) for b in range(count) if a != b and not
                   platform.driver_result(driver.cuDeviceCanAccessPeer(a, b),
                                                  "cuDeviceCanAccessPeer")]
        rows.append((OK if not blocked else PROBLEM, "peer access",
                     "every GPU reaches every other" if not blocked else
                     f"these pairs cannot reach each other: {blocked}"))
    return rows


def find_mpiexec() -> str | None:
    """``mpiexec`` on PATH, or beside this Python (the ``mpich`` wheel puts it there)."""
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep
                        + os.environ.get("PATH", ""))


def _launchers() -> list[tuple]:
    mpiexec = find_mpiexec()
    torch_v = _version("torch")
    loading = os.environ.get("CUDA_MODULE_LOADING", "LAZY (CUDA's default)")
    return [(OK if mpiexec else NOTE, "mpiexec", mpiexec or "not found (Communicator.from_env "
             "and pydfccl.launch need none)"),
            (OK if _version("mpi4py") else NOTE, "mpi4py", _version("mpi4py") or "missing"),
            (OK if torch_v else NOTE, "torch", torch_v or "missing (pip install "
             "pydfccl[torch] for pydfccl.torch)"),
            (OK if loading == "EAGER" else NOTE, "kernel loading",
             f"CUDA_MODULE_LOADING={loading}" + ("" if loading == "EAGER" else
             ": import pydfccl before anything starts CUDA, and it sets EAGER (a lazy "
             "load may wait for a spinning daemon or a peer's kernel)")),
            _work_queues()]


def _work_queues() -> tuple:
    queues = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS", "8 (CUDA's default)")
    enough = queues.isdigit() and int(queues) >= 32
    return (OK if enough else NOTE, "work queues", f"CUDA_DEVICE_MAX_CONNECTIONS={queues}"
            + ("" if enough else ": ranks that are threads of this process may share a queue "
               "and wait behind a peer's kernel; import pydfccl before anything starts CUDA, "
               "and it sets 32"))


def kernel_cache_dir() -> str:
    """Where the compiled daemons are kept: PYDFCCL_CACHE_DIR, else NUMBA_CACHE_DIR, else
    ``__pycache__`` beside the kernels' sources (``pydfccl/kernels``)."""
    return str(cache_dir())


def _cache() -> list[tuple]:
    where = (os.environ.get("PYDFCCL_CACHE_DIR") or os.environ.get("NUMBA_CACHE_DIR")
             or "beside the package (__pycache__)")
    probe = kernel_cache_dir()
    try:
        os.makedirs(probe, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=probe):
            pass
        return [(OK, "kernel cache", f"{where}: writable, so a second run loads the daemon "
                 "instead of compiling it")]
    except OSError as exc:
        return [(PROBLEM, "kernel cache", f"{where}: not writable ({exc.strerror}); every run "
                 "compiles the daemon again (set PYDFCCL_CACHE_DIR)")]


def checks() -> list[tuple]:
    """(level, what, detail) rows; a check that fails to run is a PROBLEM row itself."""
    rows = []
    for check in (_versions, _gpus, _launchers, _cache):
        try:
            rows += check()
        except Exception as exc:   # one broken query must not hide the other facts
            rows.append((PROBLEM, check.__name__.strip("_"), f"{type(exc).__name__}: {exc}"))
    return rows


def main(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="python -m pydfccl doctor",
                            description=__doc__.split("\n")[0]).parse_args(argv)
    rows = checks()
    width = max(len(what) for _, what, _ in rows)
    for level, what, detail in rows:
        print(f"{level:<7} {what:<{width}}  {detail}")
    return 1 if any(level == PROBLEM for level, _, _ in rows) else 0
