"""Rank workers for communicators with more collectives than slots (the daemon's table,
``WorldConfig.max_colls``), written with the public API: every rank registers many
collectives of every kind, submits runs of some of them in an order of its own, and checks
every result against ``pydfccl.protocol.reference``."""

import time

import numpy as np

from pydfccl.protocol.reference import reference

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
         "transfer")


def plan(ncolls: int, nranks: int) -> dict:
    """{coll_id: (kind, count, root)}, the same on every rank; a "transfer" is a send from
    rank ``root`` to the next rank."""
    out = {}
    for cid in range(ncolls):
        kind = KINDS[cid % len(KINDS)]
        if kind in ("all_to_all", "transfer") and nranks < 2:
            kind = "all_reduce"
        out[cid] = (kind, 2 + cid % 5, (cid // len(KINDS)) % nranks)
    return out


def register(comm, colls: dict) -> None:
    me, n = comm.rank, comm.nranks
    for cid, (kind, count, root) in colls.items():
        if kind == "transfer":
            if me == root:
                comm.prepare(cid, "send", count, "int64", peer=(root + 1) % n)
            elif me == (root + 1) % n:
                comm.prepare(cid, "recv", count, "int64", peer=root)
        else:
            comm.prepare(cid, kind, count, "int64", root=root)


def _input(kind: str, count: int, n: int, cid: int, run: int, rank: int) -> np.ndarray:
    elems = count * n if kind in ("reduce_scatter", "all_to_all") else count
    return (np.arange(elems, dtype=np.int64) + 1000 * cid + 100_000 * run
            + 10_000_000 * rank)


def _out_elems(kind: str, count: int, n: int) -> int:
    return {"all_gather": count * n, "all_to_all": count * n}.get(kind, count)


def _expected(kind, count, root, n, cid, run, me):
    if kind == "transfer":
        return _input(kind, count, n, cid, run, root) if me == (root + 1) % n else None
    inputs = [_input(kind, count, n, cid, run, r) for r in range(n)]
    return reference(kind, inputs, "sum", root, me)


def run_many(comm, ncolls: int, active: int, runs: int, seed: int = 0,
             prepare_only: bool = False) -> dict:
    """Register ``ncolls`` collectives, run ``runs`` runs each of ``active`` of them (spread
    over the ids) in an order of this rank's own, check every result; returns the
    timings, the mismatches (empty), the runs checked and this rank's memory."""
    n, me = comm.nranks, comm.rank
    colls = plan(ncolls, n)
    t0 = time.perf_counter()
    register(comm, colls)
    t1 = time.perf_counter()
    comm.start()
    t2 = time.perf_counter()
    out = dict(prepare_s=t1 - t0, start_s=t2 - t1, stats=comm.stats())
    if prepare_only:
        return out
    step = max(1, ncolls // max(1, active))
    chosen = list(range(0, ncolls, step))[:active]
    mine = [cid for cid in chosen if colls[cid][0] != "transfer"
            or me in (colls[cid][2], (colls[cid][2] + 1) % n)]
    work = [(cid, run) for cid in mine for run in range(runs)]
    order = np.random.default_rng(seed + 7919 * me).permutation(len(work))
    # a collective's runs keep their order on every rank (the k-th meets the k-th): the
    # permutation orders collectives and interleaves their runs
    next_run = {cid: 0 for cid in mine}
    futures = []
    for i in order:
        cid = work[i][0]
        run = next_run[cid]
        next_run[cid] += 1
        kind, count, root = colls[cid]
        x = comm.empty(len(_input(kind, count, n, cid, run, me)), "int64")
        x[...] = _input(kind, count, n, cid, run, me)
        if kind in ("all_gather", "reduce_scatter", "all_to_all"):
            y = comm.empty(_out_elems(kind, count, n), "int64")
            futures.append((cid, run, comm.run(cid, x, y)))
        else:
            futures.append((cid, run, comm.run(cid, x)))
    bad = []
    for cid, run, fut in futures:
        got = np.asarray(fut.result(timeout=600))
        kind, count, root = colls[cid]
        want = _expected(kind, count, root, n, cid, run, me)
        if want is not None and not np.array_equal(got, want):
            bad.append((cid, run, got.tolist(), want.tolist()))
    out.update(bad=bad, checked=len(futures), stats=comm.stats())
    return out


def crossed(comm, ncolls: int):
    """Every rank registers ``ncolls`` all-reduces; rank 0 runs 0 then 1, the others 1
    then 0 (a deadlock under a policy that never preempts); returns the results."""
    for cid in range(ncolls):
        comm.prepare(cid, "all_reduce", 4, "float32")
    comm.start()
    xs = {cid: comm.empty(4, "float32") for cid in (0, 1)}
    for x in xs.values():
        x[...] = comm.rank + 1
    order = (0, 1) if comm.rank == 0 else (1, 0)
    futures = {cid: comm.run(cid, xs[cid]) for cid in order}
    return [float(np.asarray(futures[cid].result(timeout=120))[0]) for cid in (0, 1)]


def one_rank_fails(comm, ncolls: int):
    """Rank 1 raises once it has submitted runs of a few collectives; rank 0 waits on its
    runs, some granted and some waiting for a grant, and returns how each ended."""
    for cid in range(ncolls):
        comm.prepare(cid, "all_reduce", 4, "float32")
    comm.start()
    xs = [comm.empty(4, "float32") for _ in range(ncolls)]
    if comm.rank == 1:
        comm.run(0, xs[0]).result(timeout=120)
        raise RuntimeError("rank 1 gives up")
    futures = [comm.run(cid, x) for cid, x in enumerate(xs)]
    ended = []
    for f in futures:
        try:
            f.result(timeout=120)
            ended.append("done")
        except Exception as exc:      # the failure, as each run sees it
            ended.append(type(exc).__name__)
    return ended


def waits_for_a_peer(comm, ncolls: int, late: float):
    """Rank 1 runs collective 5 ``late`` seconds after rank 0: rank 0's run waits for a
    grant meanwhile (a late peer, not a deadlock); returns the result."""
    for cid in range(ncolls):
        comm.prepare(cid, "all_reduce", 4, "float32")
    comm.start()
    x = comm.empty(4, "float32")
    x[...] = comm.rank + 1
    if comm.rank == 1:
        time.sleep(late)
    return float(np.asarray(comm.run(5, x).result(timeout=120))[0])


def late_shared(comm, case: str = "ok"):
    """20 all-reduces before start() through the slots they share, then more collectives
    prepared after start() (all-reduces, broadcasts, a transfer from rank 0 to rank 1),
    run in an order of each rank's own; ``case="count"``: rank 0 prepares collective 25
    with another count. Returns the late collectives' results."""
    n, me = comm.nranks, comm.rank
    for cid in range(20):
        comm.prepare(cid, "all_reduce", 4, "int64")
    comm.start()
    late = list(range(20, 30))
    counts = {cid: 5 if case == "count" and cid == 25 and me == 0 else 4 for cid in late}
    for cid in late:
        comm.prepare(cid, "broadcast" if cid % 3 == 0 else "all_reduce", counts[cid],
                     "int64", root=cid % n)
    if me == 0:
        comm.prepare(99, "send", 3, "int64", peer=1)
    elif me == 1:
        comm.prepare(99, "recv", 3, "int64", peer=0)
    futures = {}
    order = late if me % 2 == 0 else late[::-1]
    for cid in order:
        x = comm.empty(counts[cid], "int64")
        x[...] = cid * 10 + me
        futures[cid] = comm.run(cid, x)
    if me in (0, 1):
        y = comm.empty(3, "int64")
        y[...] = 7
        futures[99] = comm.run(99, y)
    out = {cid: np.asarray(f.result(timeout=120)).tolist() for cid, f in futures.items()}
    # an early one after the late ones, through the slots too
    x = comm.empty(4, "int64")
    x[...] = 1
    out[0] = np.asarray(comm.run(0, x).result(timeout=120)).tolist()
    return out


def shared_from_start(comm, mismatch: bool = False, mode=True):
    """``start(share_slots=mode)`` with one collective (rank 1 without it if
    ``mismatch``), then 30 more prepared after start() on a world of 2 slots; the sums."""
    comm.prepare(0, "all_reduce", 2, "int64")
    comm.start(share_slots=mode if not (mismatch and comm.rank == 1) else False)
    futures = []
    for cid in range(1, 31):
        comm.prepare(cid, "all_reduce", 2, "int64")
        x = comm.empty(2, "int64")
        x[...] = cid
        futures.append(comm.run(cid, x))
    return [int(np.asarray(f.result(timeout=120))[0]) for f in futures]


def overflow(comm):
    """``start(share_slots="overflow")`` on a world of 8 slots: 2 all-reduces before start,
    20 after (rank 1 runs all 22 in reverse), then a transfer from rank 0 to rank 1. The
    sums, what rank 1 received and ``stats()["shared_slots"]``."""
    for cid in range(2):
        comm.prepare(cid, "all_reduce", 2, "int64")
    comm.start(share_slots="overflow")
    for cid in range(2, 22):
        comm.prepare(cid, "all_reduce", 2, "int64")
    futures = {}
    for cid in range(22) if comm.rank == 0 else reversed(range(22)):
        x = comm.empty(2, "int64")
        x[...] = cid
        futures[cid] = comm.run(cid, x)
    sums = [int(np.asarray(futures[cid].result(timeout=120))[0]) for cid in range(22)]
    comm.prepare(50, "send" if comm.rank == 0 else "recv", 3, "int64", peer=1 - comm.rank)
    buf = comm.empty(3, "int64")
    buf[...] = 7 if comm.rank == 0 else 0
    received = np.asarray(comm.run(50, buf).result(timeout=120)).tolist()
    return sums, received if comm.rank == 1 else None, comm.stats()["shared_slots"]


def waiting_status(comm):
    """Rank 0 runs collective 3 of 20, which rank 1 never runs: its status shows the run
    waiting for a grant (rank 0 then closes with it waiting, which aborts the job)."""
    for cid in range(20):
        comm.prepare(cid, "all_reduce", 2, "int64")
    comm.start()
    if comm.rank == 0:
        comm.run(3, comm.empty(2, "int64"))
        time.sleep(0.5)
        return comm.status()[0]["waiting"]
    return None
