"""The engine end to end: launch, prepare, start, run, results, preemption, errors.

On a CPU-only machine every rank is a process running the CUDA simulator; on a GPU the
same tests run with ranks as threads on one GPU (the default backend there).
"""

import multiprocessing
import os
import time

import numpy as np
import pytest

import pydfccl
import rank_workers
import shared_workers
from pydfccl.cli.demo import DemoOptions, run_demo

CASES = [  # (count, dtype, op): counts off the slot and chunk sizes, down to 1 element
    (1, "float32", "sum"),
    (7, "int64", "sum"),
    (64, "float32", "max"),
    (65, "int32", "min"),
    (333, "float64", "sum"),
    (1000, "int64", "prod"),
    (129, "float32", "avg"),
    (50, "int32", "avg"),
    (31, "int8", "sum"),
    (17, "uint8", "max"),
]


def _check(nranks, cases, per_rank):
    for rank, out in enumerate(per_rank):
        for i, (count, dtype, op) in enumerate(cases):
            want = shared_workers.expected(nranks, count, dtype, op, i)
            got = np.array(out["results"][i], dtype=dtype)
            assert np.array_equal(got, want), f"rank {rank}, case {cases[i]}"


@pytest.mark.parametrize("nranks", [2, 3, 4])
def test_all_reduce_exact_for_odd_counts_ops_and_dtypes(nranks):
    per_rank = pydfccl.launch(rank_workers.allreduce_cases, nranks, args=(CASES,), timeout=300)
    _check(nranks, CASES, per_rank)
    assert all(r["stats"]["completed"] == len(CASES) for r in per_rank)


def test_in_place_and_repeated_runs():
    cases = CASES[:4]
    per_rank = pydfccl.launch(rank_workers.allreduce_cases, 3, args=(cases, True, 3), timeout=300)
    _check(3, cases, per_rank)
    assert all(r["stats"]["completed"] == 3 * len(cases) for r in per_rank)


def test_single_rank_is_a_copy():
    cases = [(5, "float32", "sum"), (9, "int64", "avg")]
    _check(1, cases, pydfccl.launch(rank_workers.allreduce_cases, 1, args=(cases,), timeout=120))


def test_several_blocks_and_threads_per_rank():
    """Channels (blocks) and threads per block split the data; results stay exact."""
    cases = [(3000, "float32", "sum"), (2, "int64", "max")]
    per_rank = pydfccl.launch(rank_workers.allreduce_cases, 2, args=(cases,), timeout=300,
                              nblocks=3, nthreads=2, slot_bytes=128)
    _check(2, cases, per_rank)


@pytest.mark.parametrize("count", [2, 300], ids=["a-block-without-a-share", "several-loops"])
def test_several_runs_of_a_collective_in_flight_stay_apart(count):
    """Every run goes to the SQ before any completes (up to RUNS_IN_FLIGHT of a
    collective); each daemon block queues a collective's later runs behind its active one.
    With 3 blocks, 2 elements leave one block without a share (it finishes each run as it
    takes it), and 300 take several loops, preempted in rotated orders."""
    ncolls, runs, nranks = 2, 5, 3
    per_rank = pydfccl.launch(rank_workers.runs_in_flight, nranks, args=(ncolls, runs, count),
                              nblocks=3, slot_bytes=128, timeout=300)
    for out in per_rank:
        assert out["submitted_at_once"] == ncolls * runs
        for k in range(ncolls):
            for i in range(runs):
                want = sum(shared_workers.rank_inputs(r, count, "int64", out["salt"][k][i])
                           for r in range(nranks))
                assert out["results"][f"{k},{i}"] == want.tolist(), (k, i)
        assert out["stats"]["completed"] == ncolls * runs
        # the blocks posted how far they read the SQ, and copied its entries into device
        # memory for their siblings (who read those instead of host memory)
        assert out["sq_seen"] == ncolls * runs
        assert out["copied"] == out["submitted"]


def test_launch_per_call_holds_frees_and_each_launch_takes_the_runs_before_it():
    """A device free waits for every kernel, and a baseline kernel spins until its peers'
    arrive: the baseline holds Numba's frees from each launch until nothing is outstanding.
    Several runs of a collective go to the SQ, and a launch takes those submitted before it
    and no more (its ``limit``), so that all its blocks take the same runs."""
    per_rank = pydfccl.launch(rank_workers.frees_held_while_launched, 2, args=(3,),
                              persistent=False, timeout=300)
    for out in per_rank:
        assert out["held"] and all(out["held"]), out["held"]
        assert out["held_after"] is False
        assert out["stats"]["completed"] == 3
    (out,) = pydfccl.launch(rank_workers.baseline_launch_takes_runs_up_to_its_limit, 1, args=(3,),
                            persistent=False, timeout=120)
    assert out["submitted"] == 3
    assert out["done_after_first"] == [True, False, False]
    assert out["results"] == [[7, 7, 7, 7]] * 3


def test_preempted_collectives_resume_exactly():
    """Ranks submit in rotated orders and order tasks by arrival (the paper's order): each
    rank's head waits for a peer that runs another collective, so tasks are preempted
    (mid-flight too: several loops each) and resumed from their saved step."""
    ncolls, count = 3, 500
    paper_order = pydfccl.get_policy("dfccl").with_params(ORDER_BY_ID=0)
    per_rank = pydfccl.launch(rank_workers.opposite_orders, 2, args=(ncolls, count),
                              policy=paper_order, timeout=300)
    for out in per_rank:
        for k in range(ncolls):
            want = sum(shared_workers.rank_inputs(r, count, "int64", k) for r in range(2))
            assert out["results"][k] == want.tolist()
    assert sum(r["stats"]["preemptions"] for r in per_rank) > 0


def test_chaos_demo_completes_under_dfccl():
    opts = DemoOptions(nranks=3, colls=4, iters=2, count=40, progress=False)
    per_rank = run_demo(opts)
    assert [r["verified"] for r in per_rank] == [8, 8, 8]


def test_chaos_demo_deadlock_is_reported_under_nccl():
    opts = DemoOptions(nranks=3, colls=4, iters=2, count=40, policy="nccl", progress=False)
    started = time.monotonic()
    with pytest.raises(pydfccl.RankFailedError, match="deadlock") as info:
        run_demo(opts, watchdog_timeout=3.0)
    assert "wait-for cycle: rank" in str(info.value)
    assert time.monotonic() - started < 60


def test_device_sync_between_submissions_needs_voluntary_quits():
    per_rank = pydfccl.launch(rank_workers.sync_between_submissions, 2, args=(3,), timeout=300)
    for out in per_rank:
        for k in range(3):
            want = sum(shared_workers.rank_inputs(r, 5, "int32", k) for r in range(2))
            assert out["results"][k] == want.tolist()
        # each launch's blocks count their exits on from the last (the pool's counters)
        assert out["stats"]["quits"] >= out["stats"]["relaunches"], out["stats"]
    assert sum(r["stats"]["relaunches"] for r in per_rank) > 0


def test_device_sync_under_nccl_is_a_reported_deadlock():
    with pytest.raises(pydfccl.RankFailedError, match="deadlock"):
        pydfccl.launch(rank_workers.sync_between_submissions, 2, args=(3,), policy="nccl",
                       watchdog_timeout=3.0, timeout=120)


def test_sync_behind_an_idle_daemon():
    assert pydfccl.launch(rank_workers.sync_after_completion, 2, timeout=120) == [[2.0] * 4] * 2
    with pytest.raises(pydfccl.RankFailedError, match="host blocked in a device synchronize"):
        pydfccl.launch(rank_workers.sync_after_completion, 2, policy="nccl", watchdog_timeout=3.0,
                       timeout=120)


def test_status_shows_who_waits_for_whom():
    out = pydfccl.launch(rank_workers.status_while_waiting, 2, timeout=120)
    seen = out[0]["seen"]
    assert seen[0]["outstanding"] == 1 and seen[1]["outstanding"] == 0
    block = seen[0]["blocks"][0]
    assert block["coll"] == 5 and (1, "data from") in block["waits"]
    assert seen[0]["in_flight"] == [5] and seen[0]["queued"] == {}
    daemon = seen[0]["daemon"]        # the host's view of its launches, and their log
    assert daemon["launches"] >= 1 and daemon["state"] in ("running", "paused", "launching")
    assert any(": launch 1, " in entry for entry in seen[0]["launch_log"])
    for rank, out_rank in enumerate(out):   # each rank, once its own run completed
        mine = out_rank["after"][rank]
        assert mine["outstanding"] == 0 and all(b["coll"] is None for b in mine["blocks"])


def test_mismatched_prepare_names_collective_field_and_ranks():
    with pytest.raises(pydfccl.RankFailedError,
                       match=r"collective 0: field 'count' differs across ranks "
                             r"\(ranks \[0, 2\]: 10; ranks \[1\]: 11\)"):
        pydfccl.launch(rank_workers.mismatched, 3, timeout=120)


def test_worker_exception_names_its_rank_and_frees_the_others():
    started = time.monotonic()
    with pytest.raises(pydfccl.RankFailedError, match="rank 1: KeyError") as info:
        pydfccl.launch(rank_workers.raises_on_rank_one, 2, timeout=120)
    assert info.value.rank == 1
    assert time.monotonic() - started < 60


def test_killed_rank_fails_the_others_and_leaves_nothing_behind():
    started = time.monotonic()
    with pytest.raises(pydfccl.RankFailedError, match="rank 1: process died with exit code 9"):
        pydfccl.launch(rank_workers.dies_mid_collective, 3, backend="processes", timeout=120)
    assert time.monotonic() - started < 60
    assert multiprocessing.active_children() == []


def test_rank_processes_keep_cudas_work_queues():
    """pydfccl's 32 queues are for rank threads: eight rank processes with 32 each
    exhausted MPS's connections on one GPU."""
    from pydfccl.cuda_env import chose_work_queues

    assert chose_work_queues() or "CUDA_DEVICE_MAX_CONNECTIONS" in os.environ
    expected = None if chose_work_queues() else os.environ["CUDA_DEVICE_MAX_CONNECTIONS"]
    assert pydfccl.launch(rank_workers.work_queues, 2, backend="processes",
                          timeout=120) == [expected, expected]


def test_callbacks_run_and_stats_count():
    (out,) = pydfccl.launch(rank_workers.callbacks_and_stats, 1, timeout=120)
    assert out["seen"] == [[1.0, 2.0, 3.0]]
    stats = out["stats"]
    assert stats["submitted"] == stats["completed"] == 1
    assert stats["launches"] >= 1 and stats["policy"] == "dfccl"


def test_unknown_policy_and_backend_are_refused():
    with pytest.raises(ValueError, match="unknown backend"):
        pydfccl.launch(rank_workers.mismatched, 1, backend="carrier-pigeon")
    with pytest.raises(ValueError, match="unknown policy 'bogus'"):
        pydfccl.get_policy("bogus")


def test_a_policy_rank_processes_cannot_receive_is_named_before_any_starts():
    """Rank processes are spawned: a policy written with a lambda cannot reach them, and
    the launcher says so rather than a bare PicklingError from Process.start."""
    import dataclasses

    dfccl = pydfccl.get_policy("dfccl")
    never_quits = dataclasses.replace(dfccl, name="never_quits",
                                      should_quit=lambda params, idle: 0)
    with pytest.raises(ValueError, match="the policy cannot be sent to rank processes.*"
                                         "not lambdas or closures"):
        pydfccl.launch(rank_workers.mismatched, 2, backend="processes", policy=never_quits)
    with pytest.raises(ValueError, match="the worker's arguments cannot be sent"):
        pydfccl.launch(rank_workers.mismatched, 2, backend="processes",
                       args=(lambda: None,))


def test_barrier_waits_for_every_rank():
    waited = pydfccl.launch(rank_workers.barrier_wait, 2, timeout=120)
    assert waited[0] > 0.3 and waited[1] < waited[0], waited


def test_watchdog_prints_every_threads_stack_when_asked(monkeypatch, capfd):
    """PYDFCCL_DEADLOCK_STACKS=1: a report that says "its host is blocked" comes with where
    each host thread stands."""
    from types import SimpleNamespace

    from pydfccl.host import watchdog

    blocks = np.zeros((1, 4), dtype=[("progress", "u8"), ("completed", "u8"), ("fault", "i8")])
    world = SimpleNamespace(ctl={"blocks": blocks}, config=SimpleNamespace(nblocks=4),
                            abort_with=lambda text: text)
    monkeypatch.setattr(watchdog.liveness, "dead_peers", lambda world, me: {})
    monkeypatch.setattr(watchdog.liveness, "closed_peers", lambda world, me: {})
    monkeypatch.setattr(watchdog, "wait_for_report",
                        lambda world, describe, with_absent: ("rank 1: ...", [0, 1], set()))
    dog = watchdog.Watchdog(world, 0, timeout=0.0, describe=None, proves_deadlock=True)
    assert dog.check() is None            # the first look only records the progress
    dog._next_look = 0.0
    monkeypatch.delenv("PYDFCCL_DEADLOCK_STACKS", raising=False)
    assert dog.check().startswith("deadlock: a wait-for cycle among daemons that never")
    assert "most recent call first" not in capfd.readouterr().err
    monkeypatch.setenv("PYDFCCL_DEADLOCK_STACKS", "1")
    dog._next_look = 0.0
    assert "rank 1: ..." in dog.check()
    assert "test_watchdog_prints_every_threads_stack_when_asked" in capfd.readouterr().err


def test_report_names_the_rank_its_peers_wait_for_that_runs_nothing():
    """The H200's many-collective deadlock (2026-11-29 22:44): ranks 1 to 3 inside one
    all-reduce, rank 0 on none; the waiting ranks' own edges formed a cycle."""
    from types import SimpleNamespace

    from pydfccl.protocol import layout as L
    from pydfccl.host.watchdog import WAITS_CREDIT, WAITS_DATA, wait_for_report

    ctl = np.zeros(4, L.CTL_ROW)
    for r in (1, 2, 3):     # each waits for data from r - 1 and for credit from r + 1
        ctl["blocks"][r][0]["coll"] = 42 + 1
        ctl["blocks"][r][0]["waits"] = (WAITS_DATA | WAITS_CREDIT | ((r - 1) << 2)
                                        | (((r + 1) % 4) << 18))
        ctl["host_submitted"][r] = 27
    ctl["host_submitted"][0] = 1
    world = SimpleNamespace(ctl=ctl, nranks=4, config=SimpleNamespace(nblocks=1))
    text, cycle = wait_for_report(world, lambda coll, rank: f"all_reduce {coll}")
    assert "rank 0 is on no collective while peers wait for it, with 1 outstanding" in text
    assert cycle is not None      # the ring's two-way waits, which the line above explains
    ctl["host_submitted"][0] = 0
    text, _ = wait_for_report(world, lambda coll, rank: f"all_reduce {coll}")
    assert "rank 0 is on no collective while peers wait for it, and has nothing " in text
