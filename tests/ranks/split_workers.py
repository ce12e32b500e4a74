"""Rank workers of the all_to_allv tests (test_all_to_allv.py): each run's counts come from
a seed that every rank and the test share, so the test can compute every rank's answer.
Public API only: ``comm.empty``, ``x[...] = values``, ``np.asarray``."""

import numpy as np

A2AV, ALL_REDUCE = 0, 1


def count_matrix(nranks: int, capacity: int, run: int) -> np.ndarray:
    """counts[a][b]: elements rank a sends rank b in run ``run``; zeros, the capacity and
    random sizes between them occur."""
    rng = np.random.default_rng([nranks, capacity, run])
    counts = rng.integers(0, capacity + 1, size=(nranks, nranks))
    counts[run % nranks, (run + 1) % nranks] = 0
    counts[(run + 1) % nranks, run % nranks] = capacity
    return counts


def run_input(rank: int, run: int, elems: int) -> np.ndarray:
    return (np.arange(elems) + 1000 * rank + 100_000 * run).astype(np.int32)


def uneven_runs(comm, capacity: int, runs: int, in_flight: int, share_slots=False):
    """``runs`` runs of one all_to_allv, ``in_flight`` submitted before the first is waited
    for, each beside an all_reduce that odd ranks submit first and even ranks last (ranks
    that disagree on the order need preemption to finish). Returns each run's output."""
    n, r = comm.nranks, comm.rank
    comm.prepare(A2AV, "all_to_allv", capacity, "int32")
    comm.prepare(ALL_REDUCE, "all_reduce", 300, "float32")
    comm.start(share_slots=share_slots)
    outputs, pending = [], []
    for k in range(runs):
        counts = count_matrix(n, capacity, k)
        sends, recvs = counts[r], counts[:, r]
        x = comm.empty(int(sends.sum()), "int32")
        x[...] = run_input(r, k, x.size)
        y = comm.empty(int(recvs.sum()), "int32")
        z = comm.empty(300, "float32")
        z[...] = r + 1
        submit = [lambda: comm.run(A2AV, x, y, send_counts=sends.tolist(),
                                   recv_counts=recvs.tolist()),
                  lambda: comm.run(ALL_REDUCE, z)]
        if r % 2:
            submit.reverse()
        futures = [f() for f in submit]
        pending.append(futures if r % 2 == 0 else futures[::-1])
        while len(pending) >= in_flight or (pending and k == runs - 1):
            split, reduced = pending.pop(0)
            assert np.all(np.asarray(reduced.result(timeout=120)) == n * (n + 1) / 2)
            outputs.append(np.asarray(split.result(timeout=120)).tolist())
    return dict(outputs=outputs, stats=comm.stats())


def bad_counts(comm):
    """The errors a rank's own bad counts raise, as text (nothing is submitted)."""
    n, r = comm.nranks, comm.rank
    comm.prepare(A2AV, "all_to_allv", 4, "int32")
    comm.prepare(ALL_REDUCE, "all_reduce", 4, "float32")
    comm.start()
    ok = [2] * n
    x, y = comm.empty(2 * n, "int32"), comm.empty(2 * n, "int32")
    tries = {
        "missing": dict(send_counts=ok),
        "short": dict(send_counts=ok[:-1], recv_counts=ok),
        "negative": dict(send_counts=[-1] + ok[1:], recv_counts=ok),
        "above": dict(send_counts=[5] + ok[1:], recv_counts=ok),
        "self": dict(send_counts=ok, recv_counts=[3 if p == r else 2 for p in range(n)]),
        "floats": dict(send_counts=[2.0] * n, recv_counts=ok),
        "size": dict(send_counts=[1] * n, recv_counts=[2 if p != r else 1 for p in range(n)]),
    }
    errors = {}
    for name, counts in tries.items():
        try:
            comm.run(A2AV, x, y, **counts)
        except (TypeError, ValueError) as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    try:
        comm.run(ALL_REDUCE, comm.empty(4, "float32"), send_counts=ok, recv_counts=ok)
    except ValueError as exc:
        errors["kind"] = str(exc)
    comm.barrier()
    return errors


def disagreeing_pair(comm):
    """Rank 0 sends rank 1 three elements, which rank 1 takes for two: rank 1's run fails
    with the pair named, and every rank's communicator with it (rank 0's own blocks came
    whole, so its first run may complete; its next fails). Returns the error's text."""
    import pydfccl

    comm.prepare(A2AV, "all_to_allv", 3, "int32")
    comm.start()
    sends, recvs = ([1, 3], [1, 2]) if comm.rank == 0 else ([2, 1], [2, 1])
    x, y = comm.empty(sum(sends), "int32"), comm.empty(sum(recvs), "int32")
    x[...] = 7
    try:
        for _ in range(2):
            comm.run(A2AV, x, y, send_counts=sends, recv_counts=recvs).result(timeout=120)
    except pydfccl.PydfcclError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "completed"
