"""The daemon kernel a rank launches, and the arguments it is launched with."""

from __future__ import annotations

import threading
import time

import numpy as np

from ..log import logger
from ..protocol import layout as L

__all__ = ["daemon_for", "launch_args"]

_daemons = {}
_daemons_lock = threading.Lock()


def daemon_for(policy, nthreads: int):
    """The compiled daemon of ``policy`` for blocks of ``nthreads`` (one per policy and
    register cap in a process, made when the first communicator that needs it starts).
    Logged at INFO: where it came from (shipped with the package, the kernel cache, a
    compile) and how long that took."""
    from ..kernels.limits import register_cap

    key = (policy.name, policy.functions, register_cap(nthreads))
    with _daemons_lock:
        if key not in _daemons:
            started = time.perf_counter()
            _daemons[key], how = _made(policy, nthreads, key[2])
            logger.info("daemon %s for %d threads (%d registers): %s in %.2f s", policy.name,
                        nthreads, key[2], how, time.perf_counter() - started)
        return _daemons[key]


def _made(policy, nthreads: int, registers: int) -> tuple:
    """(the daemon, how it was made): on a GPU the shipped cubin where one matches, else
    Numba's kernel, loaded from the kernel cache or compiled."""
    from ..kernels.daemon import compile_now, make_daemon
    from ..kernels.policy_types import check_policy_types
    from ..platform import backend

    if backend.kernels_on_host:
        # the simulator runs the functions as Python: refuse, as the GPU's compiler would,
        # what the device cannot compile (PolicyTypeError)
        check_policy_types(policy)
        kernel = make_daemon(policy, nthreads)
        compile_now(kernel)
        return kernel, "made (the simulator compiles nothing)"
    kernel = backend.shipped_daemon(policy, registers)
    if kernel is not None:
        return kernel, "loaded from the daemons shipped with pydfccl"
    kernel = make_daemon(policy, nthreads)
    compile_now(kernel)
    cached = sum(getattr(kernel, "_cache_hits", {}).values())
    return kernel, "loaded from the kernel cache" if cached else "compiled"


def launch_args(world, rank: int) -> tuple:
    """The daemon's arguments for rank ``rank`` of ``world``; the last is the most runs a
    launch takes (``L.NO_LIMIT``; the launch-per-collective baseline replaces it)."""
    cfg = world.config
    return (np.int64(world.ctl_addr[rank]), np.int64(world.pool_addr[rank]),
            np.int64(world.peers.addr), np.int64(rank), np.int64(cfg.nranks),
            np.int64(cfg.nslots), np.int64(cfg.slot_bytes), np.int64(cfg.conn_stride),
            np.int64(L.NO_LIMIT))
