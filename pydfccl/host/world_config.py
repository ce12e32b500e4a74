"""The sizes of a job's world (``WorldConfig``) and what they follow: the GPU's
multiprocessors, a daemon block's width, the simulator's small defaults.

Importable and answered without Numba (``gpu_query`` asks the driver): a process that only
starts rank processes sizes their world here, and one that runs ranks as threads makes its
context beside Numba's import (``cuda_start``) only if nothing loaded Numba before.
The memory itself is ``world.World``'s.
"""

from __future__ import annotations

import functools
import itertools
import os
from dataclasses import asdict, dataclass

from .. import cuda_start, gpu_query
from ..kernels.limits import MAX_THREADS, blocks_per_sm
from ..protocol import layout as L

__all__ = ["WorldConfig", "REPORT_BYTES", "new_segment", "on_gpu", "multiprocessors",
           "gpu_nblocks", "resident_blocks", "machine_sizes", "pair_transports",
           "H200_MULTIPROCESSORS"]

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


def on_gpu() -> bool:
    """Whether a world made in this process lives on a GPU (``gpu_query``: known without
    importing Numba)."""
    return gpu_query.gpu_count() > 0


def multiprocessors() -> int | None:
    """The multiprocessors of this process's GPU, None without one."""
    return gpu_query.multiprocessors()


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
    cfg = WorldConfig(nranks, simulator=not on_gpu())
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
    simulator: bool | None = None       # None: as this process's kernels run

    def __post_init__(self):
        if self.simulator is None:    # as the platform's backend runs kernels
            object.__setattr__(self, "simulator", cuda_start.simulated())
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
