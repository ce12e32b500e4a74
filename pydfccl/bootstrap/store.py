"""A loopback key-value store for ranks started without MPI (torchrun's environment).

Rank 0 serves it on ``MASTER_ADDR:MASTER_PORT``; every rank, rank 0 included, talks to it
through short connections. On top of ``set``/``get`` (which waits for the key) it offers what
the bootstrap needs of a process group: ``bcast``, ``allgather`` and ``Barrier``, with
mpi4py's names, so that ``pydfccl.bootstrap.mpi`` builds a world the same way over either. A ``get``
that waits past the join timeout raises an error that names the ranks that never arrived.
"""

from __future__ import annotations

import os
import threading
import time
from multiprocessing.connection import Client, Listener

from ..errors import PydfcclError

__all__ = ["StoreGroup", "in_env_job"]

JOIN_TIMEOUT = float(os.environ.get("PYDFCCL_JOIN_TIMEOUT", "120"))
AUTHKEY = b"pydfccl-store"


def in_env_job() -> bool:
    """Whether torchrun-style variables (RANK, WORLD_SIZE > 1) describe this process."""
    return "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


class _Server:
    def __init__(self, address):
        self.listener = Listener(address, authkey=AUTHKEY)
        self.data: dict = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._accept, name="pydfccl-store", daemon=True).start()

    def _accept(self):
        while True:
            conn = self.listener.accept()
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            op, key, value = conn.recv()
            with self.cond:
                if op == "set":
                    self.data[key] = value
                    self.cond.notify_all()
                    conn.send(True)
                    return
                found = self.cond.wait_for(lambda: key in self.data, timeout=value)
                conn.send((found, self.data.get(key)))


class StoreGroup:
    """This process's rank in a group that meets at ``MASTER_ADDR:MASTER_PORT``."""

    def __init__(self, rank: int | None = None, size: int | None = None, address=None,
                 timeout: float = JOIN_TIMEOUT):
        env = os.environ
        self.rank = int(env["RANK"]) if rank is None else rank
        self.size = int(env["WORLD_SIZE"]) if size is None else size
        self.address = address or (env.get("MASTER_ADDR", "127.0.0.1"),
                                   int(env.get("MASTER_PORT", "29500")))
        self.timeout = timeout
        self._server = _Server(self.address) if self.rank == 0 else None
        self._round = 0

    def _call(self, op, key, value=None):
        for _ in range(int(self.timeout * 10) + 1):     # rank 0 may not be listening yet
            try:
                with Client(self.address, authkey=AUTHKEY) as conn:
                    conn.send((op, key, value))
                    return conn.recv()
            except ConnectionRefusedError:
                time.sleep(0.1)
        raise PydfcclError(f"rank {self.rank}: no store at {self.address[0]}:{self.address[1]} "
                           f"(rank 0) within {self.timeout:.0f} s")

    def set(self, key: str, value) -> None:
        self._call("set", key, value)

    def get(self, key: str, who: int):
        found, value = self._call("get", key, self.timeout)
        if not found:
            raise PydfcclError(f"rank {who} did not arrive within {self.timeout:.0f} s "
                               f"(waiting for {key!r})")
        return value

    def allgather(self, obj) -> list:
        """Every rank's ``obj``. Rank 0 returns only once every rank has read them all: it
        serves the store, and a rank that reads after rank 0 exits would find no one."""
        self._round += 1
        key = str(self._round)
        self.set(f"{key}/{self.rank}", obj)
        values = [self.get(f"{key}/{r}", r) for r in range(self.size)]
        self.set(f"{key}/read/{self.rank}", True)
        if self.rank == 0:
            for r in range(self.size):
                self.get(f"{key}/read/{r}", r)
        return values

    def bcast(self, obj, root: int = 0):
        return self.allgather(obj if self.rank == root else None)[root]

    def Barrier(self) -> None:      # mpi4py's name, so both groups serve pydfccl.bootstrap.mpi
        self.allgather(None)
