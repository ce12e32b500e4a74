"""What each rank runs in the tests of ``tests/ranks``: one function a scenario, called as
``pydfccl.launch(rank_workers.NAME, nranks, ...)``.

A module, not part of the tests, because ``pydfccl.launch`` spawns rank processes that
import these functions by name (the test's folder is on their path). Each returns plain
data (lists, dicts) so that results cross process boundaries."""

import collections
import os
import time

import numpy as np

from pydfccl import platform
from pydfccl.protocol import layout as L
from shared_workers import fill, rank_inputs

__all__ = ["allreduce_cases", "opposite_orders", "mismatched",
           "raises_on_rank_one", "dies_mid_collective", "sync_between_submissions",
           "callbacks_and_stats", "sync_after_completion", "status_while_waiting",
           "many_runs_without_waiting", "runs_in_flight", "frees_held_while_launched",
           "baseline_launch_takes_runs_up_to_its_limit", "steady_resources",
           "traced_opposite_orders", "traced_counts", "dropped_or_kept_buffers",
           "point_to_point", "bad_pair", "receive_before_sending", "negative_average",
           "late_registration", "late_mismatch", "barrier_wait", "undrained_completions"]


def allreduce_cases(comm, cases, in_place=False, repeats=1):
    """Prepare one all-reduce per (count, dtype, op) case, run each ``repeats`` times, and
    return each result as a list (the test compares them with ``expected``)."""
    for i, (count, dtype, op) in enumerate(cases):
        comm.prepare(i, "all_reduce", count=count, dtype=dtype, op=op)
    comm.start()
    out = []
    for i, (count, dtype, op) in enumerate(cases):
        for _ in range(repeats):
            send = fill(comm, rank_inputs(comm.rank, count, dtype, i))
            recv = send if in_place else comm.empty(count, dtype)
            result = comm.run(i, send, None if in_place else recv).result(timeout=120)
        out.append(platform.to_numpy(result).tolist())
    return dict(results=out, stats=comm.stats())


def opposite_orders(comm, ncolls: int, count: int, rotate: bool = True):
    """Rank r submits the collectives in an order rotated by r (rank 0 and 1 disagree);
    ``rotate=False``: every rank in the same order."""
    for k in range(ncolls):
        comm.prepare(k, "all_reduce", count=count, dtype="int64")
    comm.start()
    sends = [fill(comm, rank_inputs(comm.rank, count, "int64", k)) for k in range(ncolls)]
    recvs = [comm.empty(count, "int64") for _ in range(ncolls)]
    order = [(k + comm.rank * rotate) % ncolls for k in range(ncolls)]
    futures = {k: comm.run(k, sends[k], recvs[k]) for k in order}
    results = {k: platform.to_numpy(f.result(timeout=120)).tolist() for k, f in futures.items()}
    return dict(results=[results[k] for k in range(ncolls)], stats=comm.stats())


def mismatched(comm):
    comm.prepare(0, "all_reduce", count=10 + (comm.rank == 1), dtype="float32")
    comm.start()
    return "started"


def raises_on_rank_one(comm):
    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    comm.start()
    if comm.rank == 1:
        raise KeyError("boom on rank 1")
    x = comm.empty(4, "float32")
    return comm.run(0, x).result(timeout=120).tolist()


def dies_mid_collective(comm):
    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    comm.start()
    if comm.rank == 1:
        time.sleep(0.5)
        os._exit(9)  # a rank process that vanishes without a word
    x = comm.empty(4, "float32")
    return comm.run(0, x).result(timeout=120).tolist()


def sync_between_submissions(comm, ncolls: int):
    """Disordered submissions with a device-wide synchronize after each one."""
    for k in range(ncolls):
        comm.prepare(k, "all_reduce", count=5, dtype="int32")
    comm.start()
    sends = [fill(comm, rank_inputs(comm.rank, 5, "int32", k)) for k in range(ncolls)]
    futures = {}
    for k in [(k + comm.rank) % ncolls for k in range(ncolls)]:
        futures[k] = comm.run(k, sends[k])
        comm.synchronize_device()
    results = [platform.to_numpy(futures[k].result(timeout=120)).tolist() for k in range(ncolls)]
    return dict(results=results, stats=comm.stats())


def callbacks_and_stats(comm):
    comm.prepare(0, "all_reduce", count=3, dtype="float64")
    comm.start()
    x = fill(comm, np.array([1.0, 2.0, 3.0]))
    seen = []
    fut = comm.run(0, x)
    fut.add_done_callback(lambda f: seen.append(platform.to_numpy(f.result()).tolist()))
    fut.result(timeout=60)
    deadline = time.time() + 10
    while not seen and time.time() < deadline:
        time.sleep(0.01)
    return dict(seen=seen, stats=comm.stats())


def sync_after_completion(comm):
    """A sync after everything completed: fine with dfccl (the daemon quits when idle); with
    nccl the daemon never quits, so the sync can only end through the watchdog."""
    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    comm.start()
    x = fill(comm, np.ones(4, np.float32))
    result = platform.to_numpy(comm.run(0, x).result(timeout=60)).tolist()
    comm.synchronize_device()
    return result


def status_while_waiting(comm):
    """Rank 1 submits late: meanwhile rank 0's status shows it waiting for rank 1's data."""
    comm.prepare(5, "all_reduce", count=4, dtype="float32")
    comm.start()
    x = fill(comm, np.ones(4, np.float32))
    seen = None
    if comm.rank == 1:
        time.sleep(1.5)
    future = comm.run(5, x)
    if comm.rank == 0:
        time.sleep(0.5)
        seen = comm.status()
    future.result(timeout=60)
    # The daemon writes the completion before it clears its blocks' status rows: give the
    # rows a moment to catch up with the future.
    deadline = time.monotonic() + 10
    after = comm.status()
    while (any(b["coll"] is not None for b in after[comm.rank]["blocks"])
           and time.monotonic() < deadline):
        time.sleep(0.01)
        after = comm.status()
    return dict(seen=seen, after=after)


def many_runs_without_waiting(comm, runs: int):
    """More runs than the SQ holds, submitted at once: the host queues them, none is lost,
    and they complete in submission order."""
    comm.prepare(0, "all_reduce", count=3, dtype="int64")
    comm.start()
    sends = [fill(comm, np.full(3, i + comm.rank, np.int64)) for i in range(runs)]
    recvs = [comm.empty(3, "int64") for _ in range(runs)]
    done = []
    futures = [comm.run(0, sends[i], recvs[i]) for i in range(runs)]
    submitted_at_once = comm.stats()["submitted"]
    for i, f in enumerate(futures):
        f.add_done_callback(lambda _, i=i: done.append(i))
    results = [int(platform.to_numpy(f.result(timeout=300))[0]) for f in futures]
    deadline = time.monotonic() + 30   # a future wakes its waiters before its callbacks run
    while len(done) < runs and time.monotonic() < deadline:
        time.sleep(1e-3)
    return dict(results=results, order=done, stats=comm.stats(),
                submitted_at_once=submitted_at_once)


def runs_in_flight(comm, ncolls: int, runs: int, count: int):
    """``runs`` runs of each of ``ncolls`` all-reduces, each run with its own buffers, all
    submitted before any wait, rank r interleaving the collectives in an order rotated by r:
    a daemon block queues a collective's runs behind its active one and must keep every
    run's buffers and counts apart."""
    for k in range(ncolls):
        comm.prepare(k, "all_reduce", count=count, dtype="int64")
    comm.start()
    salt = [[k * runs + i for i in range(runs)] for k in range(ncolls)]
    sends = [[fill(comm, rank_inputs(comm.rank, count, "int64", salt[k][i])) for i in range(runs)]
             for k in range(ncolls)]
    recvs = [[comm.empty(count, "int64") for _ in range(runs)] for _ in range(ncolls)]
    order = [(k + comm.rank) % ncolls for k in range(ncolls)]
    futures = {(k, i): comm.run(k, sends[k][i], recvs[k][i]) for i in range(runs) for k in order}
    submitted_at_once = comm.stats()["submitted"]
    results = {f"{k},{i}": platform.to_numpy(f.result(timeout=300)).tolist()
               for (k, i), f in futures.items()}
    pool = comm.world.pools[comm.rank]
    sq_seen = int(pool.read(L.P_SQ_SEEN, 8).view(np.int64)[0])
    fields = ("coll", "send", "recv", "priority")
    copies = pool.read(L.P_SQ_COPY, L.SQ_CAP * L.SQ_COPY_SIZE).view(L.SQ_COPY)
    kept = range(max(0, sq_seen - L.SQ_CAP), sq_seen)    # both rings hold the last SQ_CAP
    copied = [[int(copies[k % L.SQ_CAP][f]) for f in fields] for k in kept]
    sq = comm.world.ctl["sq"][comm.rank]
    submitted = [[int(sq[f][k % L.SQ_CAP]) for f in fields] for k in kept]
    return dict(results=results, salt=salt, submitted_at_once=submitted_at_once,
                stats=comm.stats(), sq_seen=sq_seen, copied=copied, submitted=submitted)


class _LaunchRecorder:
    """Records, for each communicator registered, whether its frees were held at each of its
    kernel launches. ``platform.launch`` is one function for the whole process, and rank
    threads share it, so one recorder wraps it for all of them (a rank that wrapped it
    itself would see its peers' launches, and the wrappers would unwind out of order)."""

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self._held = {}     # id(the comm's configured kernel) -> (comm, [held at launch])
        self._real = None

    def _launch(self, configured, args):
        entry = self._held.get(id(configured))
        if entry:
            entry[1].append(entry[0]._launcher.frees_held)
        self._real(configured, args)

    def add(self, comm) -> list:
        with self._lock:
            if not self._held:
                self._real = platform.launch
                platform.launch = self._launch
            held = []
            self._held[id(comm._launcher._configured)] = (comm, held)
            return held

    def remove(self, comm) -> None:
        with self._lock:
            del self._held[id(comm._launcher._configured)]
            if not self._held:
                platform.launch = self._real


_launch_recorder = _LaunchRecorder()


def frees_held_while_launched(comm, runs: int):
    """The launch-per-collective baseline (``persistent=False``): whether Numba's frees were
    held at each of this rank's kernel launches, and whether they are let go once nothing
    is outstanding."""
    comm.prepare(0, "all_reduce", count=4, dtype="int64")
    comm.start()
    held = _launch_recorder.add(comm)
    try:
        x = fill(comm, np.full(4, comm.rank, np.int64))
        futures = [comm.run(0, x, comm.empty(4, "int64")) for _ in range(runs)]
        for f in futures:
            f.result(timeout=120)
    finally:
        _launch_recorder.remove(comm)
    return dict(held=held, held_after=comm._launcher.frees_held, stats=comm.stats())


def baseline_launch_takes_runs_up_to_its_limit(comm, runs: int):
    """One rank of the launch-per-collective baseline, its launches held back while it
    submits ``runs`` runs: how many went to the SQ; which completed after a launch limited
    to the first run; then the results once a launch takes them all."""
    import numpy as np

    comm.prepare(0, "all_reduce", count=4, dtype="int64")
    comm.start()
    real_launch = platform.launch
    platform.launch = lambda configured, args: None
    try:
        x = fill(comm, np.full(4, 7, np.int64))
        futures = [comm.run(0, x, comm.empty(4, "int64")) for _ in range(runs)]
        submitted = comm.stats()["submitted"]
    finally:
        platform.launch = real_launch
    real_launch(comm._launcher._configured,
                comm._launch_args[:-1] + (np.int64(1),))   # the first run
    futures[0].result(timeout=120)
    time.sleep(0.5)                            # no kernel runs now: nothing else can finish
    done_after_first = [f.done() for f in futures]
    comm._launch_once()                        # limit: every run submitted
    results = [platform.to_numpy(f.result(timeout=120)).tolist() for f in futures]
    return dict(submitted=submitted, done_after_first=done_after_first, results=results)


def _block_threads(threads) -> list:
    """The simulator's daemon block threads among ``threads`` (none where the daemon runs on
    a GPU)."""
    if not platform.backend.kernels_on_host:
        return []
    from numba.cuda.simulator.kernel import BlockThread

    return [t for t in threads if isinstance(t, BlockThread)]


def steady_resources(comm, rounds: int):
    """Threads, Python objects and launches stay bounded over many collectives. The
    simulator's daemon runs on a block thread of its own, which ends when the daemon quits
    idle (QUIT_AFTER, 50 ms: a loaded machine may keep this thread from its next run that
    long) and comes back at its relaunch: counted apart (``block_threads``) from the
    threads that must stay."""
    import gc
    import threading

    comm.prepare(0, "all_reduce", count=2, dtype="float32")
    comm.start()
    x = fill(comm, np.ones(2, np.float32))
    y = comm.empty(2, "float32")
    counts, blocks, objects = [], [], []
    for i in range(rounds):
        comm.run(0, x, y).result(timeout=60)
        if i % (rounds // 4) == 0:
            threads = threading.enumerate()
            blocks.append(len(_block_threads(threads)))
            counts.append(len(threads) - blocks[-1])
            gc.collect()
            objects.append(len(gc.get_objects()))
    return dict(threads=counts, block_threads=blocks, objects=objects, stats=comm.stats())


def traced_opposite_orders(comm, ncolls: int, count: int):
    """opposite_orders, returning the daemon's event log as well."""
    out = opposite_orders(comm, ncolls, count)
    out["trace"] = comm.trace()
    out["lost"] = comm.trace_lost()
    return out


def traced_counts(comm, counts: tuple, runs: int):
    """An all-reduce of each count in ``counts``, each run ``runs`` times in rank-rotated
    order; the results of the last runs and the daemon's event log."""
    for k, count in enumerate(counts):
        comm.prepare(k, "all_reduce", count=count, dtype="int64")
    comm.start()
    sends = [fill(comm, rank_inputs(comm.rank, n, "int64", k)) for k, n in enumerate(counts)]
    recvs = [comm.empty(n, "int64") for n in counts]
    order = [(k + comm.rank) % len(counts) for k in range(len(counts))]
    for _ in range(runs):
        futures = {k: comm.run(k, sends[k], recvs[k]) for k in order}
        results = {k: platform.to_numpy(f.result(timeout=120)).tolist()
                   for k, f in futures.items()}
    return dict(results=[results[k] for k in range(len(counts))], trace=comm.trace(),
                lost=comm.trace_lost(), stats=comm.stats())


class _Records(list):
    """A logging handler's worth of records, kept in a list (rank processes return them)."""

    def handler(self):
        import logging

        handler = logging.Handler()
        handler.emit = self.append
        return handler


def dropped_or_kept_buffers(comm, drop: bool):
    """An in-place all-reduce and an out-of-place all-gather whose buffers the worker drops
    right after submitting them (``drop``) or keeps (the all-reduce's as a temporary view
    of an array it keeps). Rank 1 submits late, so rank 0's runs cannot complete before its
    buffers are gone. Returns the results, the stats and the pydfccl warnings logged."""
    import logging

    records = _Records()
    logging.getLogger("pydfccl").addHandler(records.handler())
    comm.prepare(0, "all_reduce", count=5, dtype="int64")
    comm.prepare(1, "all_gather", count=3, dtype="int64")
    comm.start()
    if comm.rank == 1:
        time.sleep(0.5)
    send = fill(comm, rank_inputs(comm.rank, 3, "int64", 1))
    recv = comm.empty(3 * comm.nranks, "int64")
    if drop:
        futures = [comm.run(0, fill(comm, rank_inputs(comm.rank, 5, "int64", 0))),
                   comm.run(1, send, recv)]
        del send, recv
    else:
        whole = fill(comm, np.concatenate([rank_inputs(comm.rank, 5, "int64", 0),
                                            np.zeros(3, np.int64)]))
        futures = [comm.run(0, whole[:5]), comm.run(1, send, recv)]
    results = [platform.to_numpy(f.result(timeout=120)).tolist() for f in futures]
    # Ranks that are threads of one process share the logger: keep this rank's records.
    warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING
                and r.getMessage().startswith(f"rank {comm.rank}:")]
    return dict(results=results, stats=comm.stats(), warnings=warnings)


def point_to_point(comm, transfers, runs: int):
    """``transfers``: (coll_id, sender, receiver, count, dtype). Each rank registers the
    transfers it takes part in, then submits its sends and receives ``runs`` times in an
    order that differs by rank (receives first on odd ranks), and returns what it received,
    by coll_id, for every run."""
    mine = [t for t in transfers if comm.rank in (t[1], t[2])]
    for cid, sender, receiver, count, dtype in mine:
        if comm.rank == sender:
            comm.prepare(cid, "send", count=count, dtype=dtype, peer=receiver)
        else:
            comm.prepare(cid, "recv", count=count, dtype=dtype, peer=sender)
    comm.start()
    order = sorted(mine, key=lambda t: (comm.rank == t[1]) == (comm.rank % 2 == 1))
    received = collections.defaultdict(list)
    for run in range(runs):
        futures = []
        for cid, sender, receiver, count, dtype in order:
            if comm.rank == sender:
                buf = fill(comm, rank_inputs(sender, count, dtype, cid + 10 * run))
            else:
                buf = fill(comm, np.full(count, 99, dtype))
            futures.append((cid, comm.rank == receiver, comm.run(cid, buf)))
        for cid, receiving, future in futures:
            out = platform.to_numpy(future.result(timeout=120))
            if receiving:
                received[cid].append(out.tolist())
    return dict(received)


def bad_pair(comm, case):
    """Point-to-point registrations that start() must refuse."""
    if case == "both send":
        comm.prepare(0, "send", count=4, peer=1 - comm.rank)
    elif case == "wrong peer":   # rank 0 sends to 2, but rank 1 is the one receiving
        if comm.rank < 2:
            comm.prepare(0, "send" if comm.rank == 0 else "recv", count=4, peer=2)
    else:   # the counts differ
        comm.prepare(0, "send" if comm.rank == 0 else "recv", count=4 + comm.rank,
                     peer=1 - comm.rank)
    comm.start()


def receive_before_sending(comm):
    """Ranks 0 and 1 each receive from the other before sending to it: only a daemon that
    preempts the waiting receive can run the send behind it."""
    peer = 1 - comm.rank
    comm.prepare(comm.rank, "send", count=100, dtype="int32", peer=peer)
    comm.prepare(peer, "recv", count=100, dtype="int32", peer=peer)
    comm.start()
    got = comm.run(peer, fill(comm, np.zeros(100, np.int32)))
    sent = comm.run(comm.rank, fill(comm, np.full(100, comm.rank + 7, np.int32)))
    sent.result(timeout=120)
    return platform.to_numpy(got.result(timeout=120)).tolist()


def negative_average(comm):
    """An int32 average whose sums are negative and not divisible by the rank count."""
    comm.prepare(0, "all_reduce", count=4, dtype="int32", op="avg")
    comm.start()
    mine = np.array([[-3, -1, 2, -7], [0, 0, 1, 2]][comm.rank], np.int32)
    return platform.to_numpy(comm.run(0, fill(comm, mine)).result(timeout=120)).tolist()


def late_registration(comm):
    """Collectives and transfers prepared after start(), each run once and returned."""
    comm.start()
    out = {}
    comm.prepare(0, "all_reduce", count=5)
    x = fill(comm, np.full(5, comm.rank + 1.0, np.float32))
    comm.run(0, x).result(timeout=60)
    out["all_reduce"] = platform.to_numpy(x).tolist()
    comm.prepare(1, "broadcast", count=3, dtype="int64", root=1)
    y = fill(comm, np.full(3, comm.rank, np.int64))
    comm.run(1, y).result(timeout=60)
    out["broadcast"] = platform.to_numpy(y).tolist()
    # Rank 0 sends to 1 and 1 to 0: each rank prepares its send before its recv, so the
    # two directions are registered in different orders on the two ranks.
    if comm.rank < 2:
        peer = 1 - comm.rank
        comm.prepare(100 + comm.rank, "send", count=4, peer=peer)
        comm.prepare(100 + peer, "recv", count=4, peer=peer)
        send = fill(comm, np.arange(4, dtype=np.float32) + 10 * comm.rank)
        recv = fill(comm, np.zeros(4, np.float32))
        futures = [comm.run(100 + peer, recv), comm.run(100 + comm.rank, send)]
        for f in futures:
            f.result(timeout=60)
        out["recv"] = platform.to_numpy(recv).tolist()
    return out


def late_mismatch(comm, case):
    """Ranks that prepare differently after start(); the run must fail, not hang."""
    comm.start()
    if case == "count":
        comm.prepare(0, "all_reduce", count=5 + comm.rank)
        return comm.run(0, comm.empty(5 + comm.rank, "float32")).result(timeout=60)
    if case == "order":      # rank 0 prepares an all_reduce first, the others a broadcast
        first, second = ("all_reduce", "broadcast") if comm.rank == 0 else ("broadcast",
                                                                             "all_reduce")
        comm.prepare(0, first, count=4)
        comm.prepare(1, second, count=4)
        return [comm.run(i, comm.empty(4, "float32")).result(timeout=60) for i in (0, 1)]
    if case == "missing":    # only rank 0 prepares it
        if comm.rank == 0:
            comm.prepare(0, "all_reduce", count=4)
            return comm.run(0, comm.empty(4, "float32")).result(timeout=60)
        time.sleep(8)
        return None
    raise ValueError(case)


def late_preparer(comm, late):
    """Rank 1 prepares and runs collective 0 ``late`` seconds after rank 0."""
    comm.start()
    if comm.rank == 1:
        time.sleep(late)
    comm.prepare(0, "all_reduce", count=4)
    x = comm.empty(4, "float32")
    x[...] = 1.0
    return np.asarray(comm.run(0, x).result(timeout=120)).tolist()


def barrier_wait(comm):
    """Rank 1 reaches the barrier 0.5 s late: how long each rank waited in it."""
    comm.prepare(0, "all_reduce", count=2)
    comm.start()
    if comm.rank == 1:
        time.sleep(0.5)
    t0 = time.monotonic()
    comm.barrier()
    return time.monotonic() - t0


def undrained_completions(comm, seconds: float):
    """A run that the daemon has finished and stamped in the CQ, but that the host has not
    drained yet (a busy host; here no thread may drain), needs no daemon: how many launches
    the rank made while it waited with that completion undrained."""
    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    comm.start()
    cq = comm._cq
    cq.drain = lambda: 0      # this communicator's CQ only (GPU ranks share the class)
    try:
        x = fill(comm, np.full(4, comm.rank + 1, np.float32))
        future = comm.run(0, x)
        stamps = comm.world.ctl["cq"]["stamp"][comm.rank]
        deadline = time.monotonic() + 60
        while stamps[cq.head % L.CQ_CAP] != cq.head + 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        stamped = comm.stats()["launches"]
        time.sleep(seconds)
        waited = comm.stats()["launches"]
    finally:
        del cq.drain
    total = platform.to_numpy(future.result(timeout=60)).tolist()
    return dict(stamped=stamped, waited=waited, total=total)


def work_queues(comm):
    """The CUDA work-queue count this rank process starts CUDA with (None: CUDA's)."""
    return os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
