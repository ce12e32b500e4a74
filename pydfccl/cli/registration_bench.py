"""``bench registration``: ``prepare`` + ``start`` of many collectives, and a run of each of
some of them, against collectives with slots of their own (at most ``max_colls``) in the
same invocation.

Beyond the daemon's slots (``WorldConfig.max_colls``) collectives share them
(``host/slots.py``): registration and ``start()``'s cross-rank check cost per collective
what they cost with slots of their own, memory stays the same, and a run of a collective
not bound to a slot waits for the slot leader's grant first. Each row: the collectives
registered, ``prepare`` of all of them and ``start()`` (the slowest rank's; it includes
loading the daemon, the same in both rows, and the exchange and check), the median
of ``--runs`` runs of distinct collectives one after another (each a new binding when
they share slots), and a rank's device and pinned memory. Every result is checked.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from ..bootstrap.launch import BACKENDS, launch
from ..host.world_config import on_gpu
from .exits import UsageError
from .options import where

__all__ = ["registration_worker", "measure", "format_row", "main", "HEADER"]

HEADER = (f"{'mode':<20} {'collectives':>11} {'prepare ms':>11} {'start ms':>9} "
          f"{'prepare us/coll':>15} {'run us':>9} {'device MiB':>10} {'pinned KiB':>10}")


def registration_worker(comm, ncolls: int, runs: int, count: int) -> dict:
    """Prepare ``ncolls`` all-reduces, start, then run ``runs`` distinct ones (spread over
    the ids) one at a time; times and this rank's memory."""
    t0 = time.perf_counter()
    for cid in range(ncolls):
        comm.prepare(cid, "all_reduce", count=count, dtype="float32")
    t1 = time.perf_counter()
    comm.start()
    t2 = time.perf_counter()
    x = comm.empty(count, "float32")
    times = []
    want = comm.nranks * (comm.nranks + 1) / 2
    for cid in np.linspace(0, ncolls - 1, runs).astype(int).tolist() if runs else []:
        x[...] = comm.rank + 1
        t = time.perf_counter()
        out = comm.run(cid, x).result(timeout=600)
        times.append(time.perf_counter() - t)
        got = np.asarray(out)
        if not np.all(got == want):
            raise AssertionError(f"collective {cid}: got {got[:4]}, want {want}")
    stats = comm.stats()
    return dict(prepare_s=t1 - t0, start_s=t2 - t1, run_s=times,
                device_bytes=stats["device_bytes"], pinned_bytes=stats["pinned_bytes"])


def measure(nranks: int, ncolls: int, runs: int, count: int = 2, backend=None,
            max_colls=None) -> dict:
    """One row: the slowest rank's prepare and start, the median run over all ranks."""
    sizes = {} if max_colls is None else dict(max_colls=max_colls)
    per_rank = launch(registration_worker, nranks, args=(ncolls, runs, count),
                      backend=backend, timeout=1800, **sizes)
    run_s = np.max([r["run_s"] for r in per_rank], axis=0) if runs else np.zeros(1)
    return dict(ncolls=ncolls, prepare_s=max(r["prepare_s"] for r in per_rank),
                start_s=max(r["start_s"] for r in per_rank), run_s=float(np.median(run_s)),
                device_bytes=per_rank[0]["device_bytes"],
                pinned_bytes=per_rank[0]["pinned_bytes"])


def format_row(mode: str, r: dict) -> str:
    per_coll = r["prepare_s"] / r["ncolls"] * 1e6
    return (f"{mode:<20} {r['ncolls']:>11} {r['prepare_s'] * 1e3:>11.1f} "
            f"{r['start_s'] * 1e3:>9.1f} {per_coll:>15.1f} {r['run_s'] * 1e6:>9.1f} "
            f"{r['device_bytes'] / 2 ** 20:>10.2f} {r['pinned_bytes'] / 2 ** 10:>10.1f}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl bench registration",
                                description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", "--nranks", type=int, default=2)
    p.add_argument("-k", "--colls", type=int, default=10_000,
                   help="collectives registered in the shared row")
    p.add_argument("--runs", type=int, default=None,
                   help="distinct collectives run one after another in each row (default: "
                        "100 on a GPU, 10 on the simulator)")
    p.add_argument("--max-colls", type=int, default=None,
                   help="the daemon's slots (WorldConfig.max_colls; default: the machine's)")
    p.add_argument("--backend", choices=BACKENDS, default=None)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    runs = args.runs if args.runs is not None else (100 if on_gpu() else 10)
    if args.nranks < 1 or args.colls < 1 or runs < 0:
        raise UsageError("--nranks and --colls must be at least 1, --runs at least 0")
    slots = args.max_colls
    print(f"prepare + start of many all-reduces on the {where()}: {args.nranks} ranks, "
          f"then {runs} distinct ones run one after another", flush=True)
    print(HEADER, flush=True)
    nslots = _slots(slots)
    baseline = measure(args.nranks, nslots, min(runs, nslots), backend=args.backend,
                       max_colls=slots)
    print(format_row("slots of their own", baseline), flush=True)
    shared = measure(args.nranks, args.colls, runs, backend=args.backend, max_colls=slots)
    print(format_row("shared slots", shared), flush=True)
    return 0


def _slots(max_colls) -> int:
    """The daemon's slots this machine's worlds have (``WorldConfig.max_colls``)."""
    from ..host.world_config import WorldConfig
    return WorldConfig(1, max_colls=max_colls).max_colls
