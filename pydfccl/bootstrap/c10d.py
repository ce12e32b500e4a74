"""The bootstrap over a torch c10d store: the store ``torch.distributed`` gives a process
group's backend, or the one torchrun's agent serves.

Under torchrun the agent already serves a store on ``MASTER_ADDR:MASTER_PORT`` (the
workers' ``TORCHELASTIC_USE_AGENT_STORE``), so a pydfccl job started by torchrun joins that
store as a client instead of serving its own on a port torchrun holds. Values are JSON
(``wire``), never pickle. A group's keys carry a generation that every rank takes from the
store's counter, so a second group over the same store (``destroy_process_group()`` and
``init_process_group()`` again in one process) never reads the first one's keys.

Only ``set``, ``get``, ``add`` and ``set_timeout`` of the store are used, so this module
needs torch only when it makes torchrun's store itself (``torchrun_group``).
"""

from __future__ import annotations

import os
from datetime import timedelta

from ..errors import PydfcclError
from .wire import decode, encode

__all__ = ["C10dStoreGroup", "under_torchrun", "torchrun_group"]


class C10dStoreGroup:
    """A c10d store as the group pydfccl's bootstrap takes (rank, size, allgather, bcast,
    Barrier)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta | None = None,
                 prefix: str = "pydfccl"):
        self.store, self.rank, self.size = store, rank, size
        if timeout is not None:
            store.set_timeout(timeout)
        # every rank of a group joins once: rank r of the g-th group over this store gets a
        # count in (g * size, (g + 1) * size]
        joined = int(store.add(f"{prefix}/joined", 1))
        self._prefix = f"{prefix}/{(joined - 1) // size}"
        self._round = 0

    def allgather(self, obj) -> list:
        self._round += 1
        self.store.set(f"{self._prefix}/{self._round}/{self.rank}", encode(obj))
        values = []
        for r in range(self.size):
            try:
                values.append(decode(self.store.get(f"{self._prefix}/{self._round}/{r}")))
            except RuntimeError as exc:       # the store's timeout
                raise PydfcclError(f"rank {r} did not arrive in the bootstrap (round "
                                   f"{self._round}): {exc}") from None
        return values

    def bcast(self, obj, root: int = 0):
        return self.allgather(obj if self.rank == root else None)[root]

    def Barrier(self) -> None:
        self.allgather(None)


def under_torchrun() -> bool:
    """Whether torchrun started this process and serves the job's store itself."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def torchrun_group(timeout: float) -> C10dStoreGroup:
    """This rank's group over torchrun's store (``MASTER_ADDR:MASTER_PORT``), its keys under
    the run's id and restart count."""
    try:
        from torch.distributed import PrefixStore, TCPStore
    except ImportError:
        raise PydfcclError("pydfccl: torchrun started this process, and joining its store "
                           "needs torch (pip install pydfccl[torch])") from None
    env = os.environ
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    store = TCPStore(env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), size,
                     is_master=False, timeout=timedelta(seconds=timeout))
    run = f"pydfccl/{env.get('TORCHELASTIC_RUN_ID', 'run')}/" \
          f"{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return C10dStoreGroup(PrefixStore(run, store), rank, size)
