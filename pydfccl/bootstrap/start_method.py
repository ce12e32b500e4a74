"""How ``launch`` starts rank processes: a fresh interpreter each (``spawn``), or, under the
simulator, a fork of a server process that has imported Numba's CUDA target and pydfccl
already (``forkserver``).

A spawned rank imports Numba's CUDA target first, about a second of CPU time; a simulated
job of two ranks took 1.9 to 2.2 s to launch and run one all-reduce on a 2-core machine
spawned, 0.7 to 0.8 s forked from the server. On a GPU every rank keeps a fresh
interpreter (``spawn``): a process forked from one that has loaded the CUDA driver
cannot use it, and the server's imports would be the only thing saved.

A forked rank sees the environment of its server, not the launcher's of the moment, and
pydfccl reads some variables when its modules are imported (``PYDFCCL_TIMEOUT``,
``PYDFCCL_ONE_SHOT_BYTES``, ...). So the server is started again whenever the launcher's
environment differs from the one it was started with: every rank sees the variables as
they are when ``launch`` is called, as a spawned one does.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

from .. import platform

__all__ = ["rank_context", "PRELOAD"]

PRELOAD = ["numba.cuda", "pydfccl.bootstrap.processes"]

_lock = threading.Lock()
_server_env: dict | None = None      # the environment the running server started with


def rank_context():
    """The multiprocessing context for this launch's rank processes."""
    method = platform.backend.rank_start_method
    if method != "forkserver" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    global _server_env
    from multiprocessing import forkserver

    with _lock:
        env = dict(os.environ)
        if _server_env is not None and env != _server_env:
            forkserver._forkserver._stop()           # started with another environment
        if _server_env != env:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(PRELOAD)
            forkserver.ensure_running()
            _server_env = env
        return mp.get_context("forkserver")
