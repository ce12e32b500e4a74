"""The memory a set of ranks shares: control rows, pools, peer tables, the abort report.

A ``World`` is made once per job. With ranks as threads of one process (one GPU) it owns
the memory; with one simulated process per rank each process attaches to shared-memory
segments that the launching parent made, and sees its peers' pools at its own addresses.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import asdict, dataclass

import numpy as np

from ..protocol import layout as L
from ..kernels.compiler import MAX_THREADS, blocks_per_sm
from ..log import logger
from ..platform import (DeviceBuffer, HostBuffer, PeerBuffer, backend, gpu_available,
                        ipc_handle, multiprocessors)

__all__ = ["WorldConfig", "World", "REPORT_BYTES", "new_segment", "gpu_nblocks",
           "pair_transports"]

REPORT_BYTES = 8192

_segments_made = itertools.count()


def new_segment(size: int):
    """A new shared-memory segment for a world, named ``pydfccl_<pid>_<n>`` after the process
    that makes it (and unlinks it), so that a leftover one says whose it was."""
    from multiprocessing import shared_memory

    name = f"pydfccl_{os.getpid()}_{next(_segments_made)}"
    return shared_memory.SharedMemory(name=name, create=True, size=size)


def pair_transports(nodes: list[int]) -> dict:
    """{"ipc": pairs on one node, "mpi": pairs across nodes} of ranks on ``nodes``."""
    pairs = list(itertools.combinations(nodes, 2))
    across = sum(a != b for a, b in pairs)
    return {"ipc": len(pairs) - across, "mpi": across}


H200_MULTIPROCESSORS = 132   # sizes a GPU world on a machine without one (PTX, models)


def resident_blocks(nthreads: int, sms: int) -> int:
    """Daemon blocks of ``nthreads`` that ``sms`` multiprocessors run at once. A block
    beyond them waits for room, and its peers wait for it: under dfccl until a daemon
    quits (slow), under the nccl policy for ever."""
    return sms * blocks_per_sm(nthreads)


def gpu_nblocks(nranks: int, nthreads: int = MAX_THREADS) -> int:
    """A rank's daemon blocks by default on a GPU: MAX_BLOCKS (32), or the largest power of
    two that lets ``nranks`` ranks' daemons all be resident on one GPU when they share it
    (``resident_blocks``). On an H200 with 4 ranks, 32 blocks ran 8 MiB to 128 MiB
    all-reduces 3.8 to 5.9 times faster than 4 blocks, and small ones as fast."""
    sms = multiprocessors() or H200_MULTIPROCESSORS
    share = max(1, resident_blocks(nthreads, sms) // nranks)
    return min(L.MAX_BLOCKS, 1 << (share.bit_length() - 1))


_DEFAULTS = {   # in this order; a callable default is of the config filled so far
    False: dict(nthreads=512, nblocks=lambda cfg: gpu_nblocks(cfg.nranks, cfg.nthreads),
                nslots=4, slot_bytes=128 * 1024, max_colls=32),
    True: dict(nblocks=1, nthreads=1, nslots=4, slot_bytes=256, max_colls=16),
}


def machine_sizes(nranks: int, nblocks: int | None = None,
                  slot_bytes: int | None = None) -> tuple[int, int]:
    """(nblocks, slot_bytes), each filled in when omitted with what a launch on this machine
    takes by default (the simulator's where there is no GPU): for code that cuts data as
    the daemon does (``reference.ring_order``, ``hbm.rank_traffic``)."""
    if nblocks is None or slot_bytes is None:
        default_blocks, default_slot = _default_sizes(nranks)
        nblocks = default_blocks if nblocks is None else nblocks
        slot_bytes = default_slot if slot_bytes is None else slot_bytes
    return nblocks, slot_bytes


@functools.lru_cache(maxsize=None)
def _default_sizes(nranks: int) -> tuple[int, int]:
    """A launch's default (nblocks, slot_bytes) on this machine, asked of the driver once
    (a check of every result, as the demo's, would otherwise ask at every call)."""
    cfg = WorldConfig(nranks, simulator=not gpu_available())
    return cfg.nblocks, cfg.slot_bytes


@dataclass(frozen=True)
class WorldConfig:
    """Sizes fixed for a job. Unset sizes take defaults that suit an H200 (GPU) or a quick
    CPU run (``simulator=True``: one thread per block, small slots)."""

    nranks: int
    nblocks: int | None = None
    nthreads: int | None = None
    nslots: int | None = None
    slot_bytes: int | None = None
    max_colls: int | None = None
    simulator: bool = backend.kernels_on_host

    def __post_init__(self):
        for name, value in _DEFAULTS[self.simulator].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value(self) if callable(value) else value)
        checks = [
            (self.nranks >= 1, "nranks must be >= 1"),
            (1 <= self.nblocks <= L.MAX_BLOCKS, f"nblocks must be in 1..{L.MAX_BLOCKS}"),
            (1 <= self.nthreads <= MAX_THREADS, f"nthreads must be in 1..{MAX_THREADS} (the "
                                                 "daemon's register cap allows no more)"),
            (self.nslots >= 2, "nslots must be >= 2 (a ring step receives and sends at "
                                "once, so with one slot every rank would wait for a free one)"),
            (self.slot_bytes >= 16 and self.slot_bytes % 16 == 0,
             "slot_bytes must be a positive multiple of 16"),
            (1 <= self.max_colls <= L.MAX_COLLS, f"max_colls must be in 1..{L.MAX_COLLS}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"WorldConfig: {message}")

    @property
    def ctl_bytes(self) -> int:
        return self.nranks * L.CTL_ROW.itemsize + REPORT_BYTES

    @property
    def pool_bytes(self) -> int:
        return L.pool_bytes(self.max_colls, self.nblocks, self.nslots, self.slot_bytes)

    @property
    def conn_stride(self) -> int:
        return L.conn_bytes(self.nslots, self.slot_bytes)

    def as_dict(self) -> dict:
        return asdict(self)


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
