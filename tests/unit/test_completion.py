"""The completion queue and submissions (``host.completion``, ``host.submission``) on their
own: a stand-in daemon takes SQ entries from a control row in host memory and posts CQ
entries as the real one does (the stamp last), so no kernel runs."""

import contextlib

import numpy as np
import pytest

from pydfccl.errors import AbortedError
from pydfccl.host import completion
from pydfccl.host.futures import CollectiveFuture
from pydfccl.protocol import layout as L
from standin_rank import Rank


@pytest.fixture
def held(monkeypatch):
    """Each time completions hold Numba's frees back (``platform.deferred_frees``)."""
    times = []

    @contextlib.contextmanager
    def deferred_frees():
        times.append(True)
        yield

    monkeypatch.setattr(completion.platform, "deferred_frees", deferred_frees)
    return times


def test_completions_complete_the_futures_in_cq_order_and_move_the_counts():
    rank = Rank()
    futures = [rank.run(0), rank.run(1), rank.run(0)]
    assert rank.sub.submitted == 3 and rank.ctl["host_submitted"][0] == 3
    assert rank.cq.drain() == 0 and rank.cq.outstanding == 3
    assert rank.daemon.complete(2) == [0, 1]
    assert rank.cq.drain() == 2
    assert [f.done() for f in futures] == [True, True, False]
    assert futures[0].result() is rank.buffers[0]         # recv: in place, the send buffer
    assert rank.cq.completed == 2 and rank.ctl["host_completed"][0] == 2
    assert rank.cq.head == 2 and rank.cq.outstanding == 1


def test_undone_counts_the_runs_whose_stamp_is_not_posted():
    rank = Rank()
    for _ in range(3):
        rank.run()
    rank.daemon.complete(2)
    with rank.lock:
        assert rank.cq.undone() == 1      # posted, not drained: no daemon needed for them
    rank.cq.drain()
    with rank.lock:
        assert rank.cq.undone() == 1 and rank.cq.outstanding == 1


def test_next_stamp_is_where_the_next_completion_will_be_posted():
    rank = Rank()
    rank.run()
    addr, want = rank.cq.next_stamp()
    stamps = rank.ctl["cq"]["stamp"][0]
    assert (addr, want) == (stamps.ctypes.data, 1)
    rank.daemon.complete()
    rank.cq.drain()
    assert rank.cq.next_stamp() == (stamps.ctypes.data + stamps.strides[0], 2)


def test_runs_beyond_the_in_flight_limit_wait_on_the_host_until_one_completes():
    rank = Rank()
    woken = []
    rank.sub.wake = lambda: woken.append(True)
    futures = [rank.run() for _ in range(L.RUNS_IN_FLIGHT + 2)]
    assert rank.sub.submitted == L.RUNS_IN_FLIGHT
    assert rank.sub.queued_counts() == {0: 2} and rank.sub.in_flight_indices() == [0]
    rank.daemon.complete()
    assert rank.cq.drain() == 1
    assert rank.sub.submitted == L.RUNS_IN_FLIGHT + 1 and woken == [True]
    for _ in range(L.RUNS_IN_FLIGHT + 1):
        rank.daemon.complete()
        assert rank.cq.drain() == 1
    assert all(f.done() for f in futures) and rank.sub.queued_counts() == {}


def test_a_held_collective_submits_nothing_until_released():
    rank = Rank()
    with rank.lock:
        rank.sub.hold(1, since=0.0)
    futures = [rank.run(1), rank.run(1), rank.run(0)]
    assert rank.sub.submitted == 1 and rank.sub.queued_counts() == {1: 2}
    with rank.lock:
        rank.sub.release(1)
        assert rank.sub.submit_waiting(1) == 2
    rank.daemon.complete(3)
    assert rank.cq.drain() == 3 and all(f.done() for f in futures)


def test_a_thread_that_finds_the_drain_taken_returns_at_once():
    rank = Rank()
    future = rank.run()
    rank.daemon.complete()
    with rank.cq._drain_lock:            # another thread is draining
        assert rank.cq.drain() == 0 and not future.done()
    assert rank.cq.drain() == 1 and future.done()


def test_fail_all_fails_the_runs_in_flight_and_held():
    rank = Rank()
    futures = [rank.run() for _ in range(L.RUNS_IN_FLIGHT + 1)]
    rank.state.fail(AbortedError("peer gone"))
    for f in futures:
        with pytest.raises(AbortedError, match="peer gone"):
            f.result(timeout=1)
    assert rank.sub.in_flight_indices() == [] and rank.sub.queued_counts() == {}
    rank.state.fail(AbortedError("later"))
    assert str(rank.state.error) == "peer gone"        # the first error stays


def test_the_baseline_hooks_run_when_nothing_is_outstanding_and_on_resubmission():
    rank = Rank()
    idle, resubmitted = [], []
    rank.cq.on_idle = lambda: idle.append(rank.cq.outstanding)
    rank.cq.on_resubmitted = lambda: resubmitted.append(rank.sub.submitted)
    for _ in range(L.RUNS_IN_FLIGHT + 1):
        rank.run()
    rank.daemon.complete()
    rank.cq.drain()
    assert resubmitted == [L.RUNS_IN_FLIGHT + 1] and idle == []
    rank.daemon.complete(L.RUNS_IN_FLIGHT)
    rank.cq.drain()
    assert idle == [0]


def test_a_run_whose_buffers_and_future_only_pydfccl_held_is_counted_and_named(caplog,
                                                                             held):
    rank = Rank()
    with rank.lock:
        buffers = send, recv = np.zeros(2), np.zeros(2)     # one tuple, as run() makes
        rank.sub.add(1, CollectiveFuture(rank.cq, running=True, buffers=buffers),
                     send.ctypes.data, recv.ctypes.data, 0, buffers)
        del send, recv, buffers
    rank.daemon.complete()
    rank.cq.drain()
    assert rank.cq.dropped_buffers == 2 and held == [True]
    assert "collective 11's send buffer was dropped" in caplog.text


def test_a_future_the_user_keeps_holds_its_buffers_and_nothing_is_reported(caplog, held):
    """Submit, drop the buffers, keep the future: its result is the recv buffer, alive."""
    rank = Rank()
    with rank.lock:
        buffers = send, recv = np.zeros(2), np.zeros(2)
        future = CollectiveFuture(rank.cq, running=True, buffers=buffers)
        rank.sub.add(1, future, send.ctypes.data, recv.ctypes.data, 0, buffers)
        recv_id = id(recv)
        del send, recv, buffers
    rank.daemon.complete()
    rank.cq.drain()
    assert id(future.result()) == recv_id
    assert rank.cq.dropped_buffers == 0 and held == [] and "dropped" not in caplog.text


@pytest.mark.parametrize("with_callback", [False, True])
def test_completion_holds_frees_only_when_a_callback_could_free(held, with_callback):
    """A done-callback runs on the completing thread and may free device memory there, which
    can wait behind a daemon: only then (or for dropped buffers, or a daemon that never
    quits) are Numba's frees held back while futures complete."""
    rank = Rank()
    future = rank.run()
    seen = []
    if with_callback:
        future.add_done_callback(lambda f: seen.append(f.result()))
    rank.daemon.complete()
    rank.cq.drain()
    assert future.result() is rank.buffers[0]
    assert held == ([True] if with_callback else [])
    assert seen == ([rank.buffers[0]] if with_callback else [])


def test_a_daemon_that_never_quits_holds_frees_at_every_completion(held):
    rank = Rank(quits=False)
    rank.run()
    rank.daemon.complete()
    rank.cq.drain()
    assert held == [True]
