"""All-reduce times across nodes, under mpiexec: ``mpiexec -n N python -m pydfccl bench net``.

In one run, for each size: pydfccl on the job's ranks as they are placed (pairs across
nodes through the network proxy; ``PYDFCCL_RANKS_PER_NODE`` emulates nodes), pydfccl over
shared memory or CUDA IPC only (the whole job when its ranks are on one machine, else each
node's ranks), and mpi4py's own ``Allreduce`` on host buffers of the same size. Each row is
the median over iterations of the slowest rank's time from ``run()`` to its result (for
MPI, one ``Allreduce``). Every pydfccl run's result is checked, outside the timed part,
with inputs that change from one run to the next. Below the table, where the network
proxies' time went in the run across nodes (``transport.timings``). ``python -m pydfccl
bench`` under mpiexec runs this.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from ..bootstrap.topology import RANKS_PER_NODE, node_indices, rank_hosts
from ..host.gcpause import gc_paused
from ..host.world_config import on_gpu
from ..transport.summary import describe_transports
from ..transport.timings import timings_table
from .exits import UsageError
from .options import where

__all__ = ["build_parser", "net_sizes", "main"]


def net_sizes() -> list[int]:
    """Bytes of each all-reduce by default: 8 B to 64 MiB by 4x on a GPU, 8 B to 4 KiB on
    the simulator (whose steps take milliseconds)."""
    top = 64 << 20 if on_gpu() else 4096
    sizes, size = [], 8
    while size <= top:
        sizes.append(size)
        size *= 4 if on_gpu() else 8
    return sizes


def _slowest(group, times: np.ndarray) -> float:
    """The median over iterations of the slowest rank's time, in microseconds."""
    return float(np.median(np.max(group.allgather(times), axis=0)) * 1e6)


def _check(rank: int, size: int, got: np.ndarray, want: int, run: int) -> None:
    """Every element of a run's result is ``want`` (the ranks' inputs summed), or the
    benchmark stops, naming the rank, size and run."""
    wrong = np.flatnonzero(got != want)
    if wrong.size:
        raise AssertionError(f"rank {rank}: wrong all-reduce of {size} bytes in run {run}: "
                             f"{wrong.size} elements differ from {want} (first at "
                             f"{wrong[0]}: {got[wrong[0]]})")


def _dfccl_times(group, sizes: list[int], iters: int, warmup: int, dtype: str) -> tuple:
    """{bytes: median us} of pydfccl all-reduces on ``group``'s ranks, the pairs by
    transport, and {bytes: every rank's network proxy's timings of the timed runs (None
    for a rank without one)} on the group's rank 0."""
    from ..host.communicator import Communicator

    itemsize = np.dtype(dtype).itemsize
    out, timings = {}, {}
    with Communicator.from_mpi(group, max_colls=max(len(sizes), 2)) as comm:
        proxy = comm.world.net
        for k, size in enumerate(sizes):
            comm.prepare(k, "all_reduce", count=size // itemsize, dtype=dtype)
        comm.start()
        for k, size in enumerate(sizes):
            x = comm.empty(size // itemsize, dtype)
            times = np.empty(iters)
            with gc_paused():
                for i in range(warmup + iters):
                    # each run's inputs differ from the last's, so a result left over from
                    # the run before cannot pass for this one's
                    shift = i % 3
                    if i == warmup and proxy is not None:
                        proxy.timings.take()        # the timed runs' alone
                    x[...] = comm.rank + 1 + shift
                    group.Barrier()
                    t0 = time.perf_counter()
                    y = comm.run(k, x).result(timeout=600)
                    if i >= warmup:
                        times[i - warmup] = time.perf_counter() - t0
                    _check(comm.rank, size, np.asarray(y),
                           group.size * (group.size + 1) // 2 + group.size * shift, i)
            out[size] = _slowest(group, times)
            timings[size] = group.gather(None if proxy is None else proxy.timings.take())
        pairs = describe_transports(comm.world.transports())
    return out, pairs, timings


def _mpi_times(group, sizes: list[int], iters: int, warmup: int, dtype: str) -> dict:
    """{bytes: median us} of mpi4py's ``Allreduce`` on host numpy buffers."""
    from mpi4py import MPI

    out = {}
    for size in sizes:
        x = np.full(size // np.dtype(dtype).itemsize, group.rank + 1, dtype)
        y = np.empty_like(x)
        times = np.empty(iters)
        with gc_paused():
            for i in range(warmup + iters):
                group.Barrier()
                t0 = time.perf_counter()
                group.Allreduce(x, y, op=MPI.SUM)
                if i >= warmup:
                    times[i - warmup] = time.perf_counter() - t0
        out[size] = _slowest(group, times)
    return out


def _ipc_group(world):
    """The ranks that reach each other without the network: the whole job when all its
    processes are on one machine (nodes emulated or none), else each node's ranks; how to
    name them; and whether they are all on one machine."""
    from mpi4py import MPI

    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    one_machine = world.allreduce(local.size, op=MPI.MIN) == world.size
    local.Free()
    if one_machine:
        return world.Dup(), f"{world.size} ranks", True
    nodes = node_indices(rank_hosts(world))
    mine = world.Split(nodes[world.rank], world.rank)
    return mine, f"each node's {mine.size} ranks", False


def build_parser() -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog="mpiexec -n N python -m pydfccl bench net",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--bytes", default=None,
                   help="comma-separated sizes in bytes (default: 8 B to 64 MiB on a GPU, "
                        "to 4 KiB on the simulator)")
    p.add_argument("--iters", type=int, default=50 if gpu else 5)
    p.add_argument("-w", "--warmup", type=int, default=5 if gpu else 1)
    p.add_argument("-d", "--dtype", default="float32")
    p.add_argument("--switch-interval", type=float, default=None,
                   help="set sys.setswitchinterval (seconds) in every rank process: how "
                        "often a thread that wants the GIL (a network proxy) gets it from "
                        "one that holds it")
    return p


def main(argv: list[str]) -> int:
    from mpi4py import MPI

    args = build_parser().parse_args(argv)
    itemsize = np.dtype(args.dtype).itemsize
    sizes = ([int(s) for s in args.bytes.split(",")] if args.bytes else net_sizes())
    if args.iters < 1 or args.warmup < 0 or any(s < itemsize or s % itemsize for s in sizes):
        raise UsageError(f"--iters at least 1, --warmup at least 0, and every size a "
                         f"positive multiple of {itemsize} bytes ({args.dtype})")
    if args.switch_interval is not None:
        if args.switch_interval <= 0:
            raise UsageError(f"--switch-interval {args.switch_interval}: must be positive")
        sys.setswitchinterval(args.switch_interval)
    world = MPI.COMM_WORLD
    net, pairs, timings = _dfccl_times(world, sizes, args.iters, args.warmup, args.dtype)
    ipc_group, ipc_name, one_machine = _ipc_group(world)
    emulated = os.environ.pop(RANKS_PER_NODE, None)     # its ranks are one node
    try:
        ipc, _, _ = _dfccl_times(ipc_group, sizes, args.iters, args.warmup, args.dtype)
    finally:
        if emulated is not None:
            os.environ[RANKS_PER_NODE] = emulated
    mpi = _mpi_times(world, sizes, args.iters, args.warmup, args.dtype)
    if world.rank == 0:
        print(f"all-reduce across nodes on the {where()}: {world.size} ranks, {pairs}; "
              f"ipc: pydfccl on {ipc_name} without the network; mpi: mpi4py Allreduce on "
              f"host buffers; median of the slowest rank over {args.iters} runs after "
              f"{args.warmup} warm-up; GIL switch interval {sys.getswitchinterval() * 1e3:g} "
              f"ms")
        print(f"{'bytes':>10} {'dfccl net us':>13} {'dfccl ipc us':>13} {'mpi4py us':>10} "
              f"{'net/mpi':>8}")
        for size in sizes:
            print(f"{size:>10} {net[size]:>13.1f} {ipc[size]:>13.1f} {mpi[size]:>10.1f} "
                  f"{net[size] / mpi[size]:>8.2f}", flush=True)
        if any(r is not None for ranks in timings.values() for r in ranks):
            print("the network proxies in the timed runs across nodes, every rank's samples "
                  "(loop gap: from one look at the shadows to the next; pool write: a "
                  "received slot and its tail; transit: from the sender's proxy to the "
                  "receiver's, on one machine only)")
            print("\n".join(timings_table(timings, one_machine)), flush=True)
    ipc_group.Free()
    return 0
