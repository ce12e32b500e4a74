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
    Logged at INFO: whether it came from the kernel cache or was compiled, and how long
    that took."""
    from ..kernels.compiler import register_cap
    from ..kernels.daemon import compile_now, make_daemon
    from ..platform import backend
    from ..kernels.policy_types import check_policy_types

    key = (policy.name, policy.functions, register_cap(nthreads))
    with _daemons_lock:
        if key not in _daemons:
            if backend.kernels_on_host:
                # the simulator runs the functions as Python: refuse, as the GPU's
                # compiler would, what the device cannot compile (PolicyTypeError)
                check_policy_types(policy)
            started = time.perf_counter()
            kernel = make_daemon(policy, nthreads)
            compile_now(kernel)
            _daemons[key] = kernel
            if not hasattr(kernel, "_cache_hits"):
                how = "made (the simulator compiles nothing)"
            else:
                how = ("loaded from the kernel cache" if sum(kernel._cache_hits.values())
                       else "compiled")
            logger.info("daemon %s for %d threads (%d registers): %s in %.2f s", policy.name,
                        nthreads, key[2], how, time.perf_counter() - started)
        return _daemons[key]


def launch_args(world, rank: int) -> tuple:
    """The daemon's arguments for rank ``rank`` of ``world``; the last is the most runs a
    launch takes (``L.NO_LIMIT``; the launch-per-collective baseline replaces it)."""
    cfg = world.config
    return (np.int64(world.ctl_addr[rank]), np.int64(world.pool_addr[rank]),
            np.int64(world.peers.addr), np.int64(rank), np.int64(cfg.nranks),
            np.int64(cfg.nslots), np.int64(cfg.slot_bytes), np.int64(cfg.conn_stride),
            np.int64(L.NO_LIMIT))
