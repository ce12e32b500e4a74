"""The memory a set of ranks shares: control rows, pools, peer tables, the abort report.

A ``World`` is made once per job. With ranks as threads of one process (one GPU) it owns
the memory; with one simulated process per rank each process attaches to shared-memory
segments that the launching parent made, and sees its peers' pools at its own addresses.
"""

from __future__ import annotations

import numpy as np

from ..log import logger
from ..platform import (DeviceBuffer, HostBuffer, PeerBuffer, backend, ipc_handle,
                        multiprocessors)
from ..protocol import layout as L
from .world_config import REPORT_BYTES, WorldConfig, pair_transports, resident_blocks

__all__ = ["World"]


def _warn_if_daemons_overflow(config: WorldConfig) -> None:
    """Warn when the ranks' daemon blocks, all on this process's GPU, cannot be resident at
    once (``resident_blocks``)."""
    sms = multiprocessors()
    if sms is None:
        return
    blocks, room = config.nranks * config.nblocks, resident_blocks(config.nthreads, sms)
    if blocks > room:
        logger.warning("%d ranks x %d daemon blocks = %d blocks, but this GPU holds %d at "
                       "once (%d multiprocessors x %d): the daemons will not all run together; "
                       "pass a smaller nblocks (the default takes the ranks' share)",
                       config.nranks, config.nblocks, blocks, room, sms, room // sms)


class World:
    """Control rows (host-visible), one pool per rank (device), and each rank's peer table.

    Three ways to make one:
    - ``World(config)``: every rank in this process (threads on one GPU); it allocates all.
    - ``ctl_mem`` and ``pool_mem``, zeroed uint8 views of shared memory (the simulator, one
      process per rank): every process sees the same rows and pools.
    - ``ctl_mem`` and ``ipc=(rank, allgather)`` (GPUs, one process per rank): the rows are
      shared memory registered with the driver; the process allocates its own pool and
      opens its peers' through CUDA IPC handles exchanged by ``allgather``.

    ``keep``: objects that must live as long as the world, such as the shared-memory
    segments that ``ctl_mem`` and ``pool_mem`` view.

    ``nodes``: each rank's node (0 for all by default). A rank on another node than
    ``nodes_of`` (this process's rank) cannot be reached through shared memory or CUDA IPC:
    its pool here is a *shadow* in this process's host memory (mapped for the device on a
    GPU), which the daemon writes as it would the peer's pool and the network proxy
    (``pydfccl.transport``) carries to the peer; its control row here is a replica that the
    proxy refreshes. ``net``: that proxy, once started (None within one node).
    """

    def __init__(self, config: WorldConfig, ctl_mem: np.ndarray | None = None,
                 pool_mem: np.ndarray | None = None, ipc: tuple | None = None,
                 keep: tuple = (), nodes: list[int] | None = None, nodes_of: int = 0):
        self.config = config
        self._keep = keep
        n = config.nranks
        self.nodes = list(nodes) if nodes is not None else [0] * n
        self.remote = frozenset(r for r in range(n) if self.nodes[r] != self.nodes[nodes_of])
        self.net = None
        self._ctl = HostBuffer(config.ctl_bytes, ctl_mem)
        rows = n * L.CTL_ROW.itemsize
        self.ctl = self._ctl.array[:rows].view(L.CTL_ROW)
        self.ctl_bytes_view = self._ctl.array[:rows]
        self.report = self._ctl.array[rows:rows + REPORT_BYTES]
        self.ctl_addr = [self._ctl.addr + r * L.CTL_ROW.itemsize for r in range(n)]
        size = config.pool_bytes
        if ipc is not None:
            rank, allgather = ipc
            own = DeviceBuffer(size)
            handles = allgather(ipc_handle(own))
            self.pools = [own if r == rank else HostBuffer(size) if r in self.remote
                          else PeerBuffer(h) for r, h in enumerate(handles)]
        elif pool_mem is None:
            _warn_if_daemons_overflow(config)
            self.pools = [DeviceBuffer(size) for _ in range(n)]
        else:
            if not backend.device_memory_is_host:
                raise RuntimeError("shared-memory pools are for the simulator only")
            self.pools = [HostBuffer(size) if r in self.remote
                          else DeviceBuffer(size, pool_mem[r * size:(r + 1) * size])
                          for r in range(n)]
        self.pool_addr = [p.addr for p in self.pools]
        # Pools this process allocated are all on its one GPU: the daemons need only order
        # their memory at GPU scope. Pools of other processes may be on other GPUs, and the
        # simulator's stand for them: system scope (the pools start zeroed).
        if pool_mem is None and ipc is None:
            for pool in self.pools:
                pool.write(L.P_PEERS_LOCAL, np.ones(1, np.int64))
        self.peers = DeviceBuffer(8 * n)
        self.peers.write(0, np.array(self.pool_addr, dtype=np.int64))

    @property
    def nranks(self) -> int:
        return self.config.nranks

    def transports(self) -> dict:
        """{transport: pairs of ranks}: "ipc" for the pairs on one node (CUDA IPC, shared
        memory under the simulator, or one process), "mpi" for those the proxy joins."""
        return pair_transports(self.nodes)

    def activity(self) -> int:
        """Changes whenever any rank submits or makes progress, or the network proxy
        delivers data or credit from another node: a reason to relaunch a daemon that quit
        stuck (a remote rank's row arrives only every ``transport.rows.ROW_PERIOD``)."""
        ctl = self.ctl
        seen = int(ctl["host_submitted"].sum()) + int(ctl["blocks"]["progress"].sum())
        return seen if self.net is None else seen + self.net.delivered

    def set_report(self, text: str) -> None:
        raw = text.encode()[: REPORT_BYTES - 1]
        self.report[: len(raw)] = np.frombuffer(raw, np.uint8)
        self.report[len(raw)] = 0

    def get_report(self) -> str:
        raw = bytes(self.report)
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    def abort_with(self, report: str) -> str:
        """Abort every rank, leaving ``report`` for them to raise unless an earlier abort left
        its own (the first report stays); returns the report in force. A rank that closed
        sets its own abort word without a report: that is no cause, and does not count."""
        if not self.report[0]:
            self.set_report(report)
        self.abort_all()
        return self.get_report() or report

    def abort_all(self) -> None:
        for r in range(self.nranks):
            self.ctl["abort"][r] = 1
