"""How a thread waiting in ``Future.result()`` learns of its completion: the helper wait of
``CompletionQueue.help_until_done``, on a real CQ in host memory whose stamp a thread of the
test posts (under the simulator the communicator's waiters do not spin at all), and the
poller's side of it (``PolledRank.poll_once``, ``poller.unhelped_comms``)."""

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pydfccl.host import completion, hostspin
from pydfccl.host import poller as progress
from pydfccl.host.futures import CollectiveFuture
from pydfccl.host.polled import PolledRank
from pydfccl.host.rankstate import Phase
from standin_rank import Rank


class Waiting(Rank):
    """A rank with one run submitted; ``post()`` completes it as the daemon would. Drains
    are recorded by thread; ``held_elsewhere``: another thread holds the drain."""

    def __init__(self, held_elsewhere=False):
        super().__init__()
        self.future = self.run()
        self.drained_by = []
        real = self.cq.drain

        def drain():
            if held_elsewhere:
                return 0
            count = real()
            if count:
                self.drained_by.append(threading.get_ident())
            return count

        self.cq.drain = drain

    def post(self):
        self.daemon.complete()

    def wait(self):
        self.cq.help_until_done(self.future, None)


def _after(seconds, fn):
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


@pytest.fixture
def sleeps(monkeypatch):
    """The waiter's sleeps on its future, counted; a spin budget that a loaded machine does
    not exhaust (a waiter returns as soon as its future is done, so a long one costs nothing
    when the test passes)."""
    calls = []
    real = completion.wait_for_futures

    def counted(futures, timeout):
        calls.append(timeout)
        return real(futures, timeout=timeout)

    monkeypatch.setattr(completion, "wait_for_futures", counted)
    monkeypatch.setattr(CollectiveFuture, "SPIN_SECONDS", 60.0)
    return calls


def test_a_waiter_that_sees_its_stamp_drains_it_itself(sleeps):
    rank = Waiting()
    _after(0.005, rank.post)
    rank.wait()
    assert rank.future.done()
    assert rank.drained_by == [threading.get_ident()]
    assert sleeps == []          # it never waited for another thread to drain


def test_a_waiter_whose_stamp_another_thread_drains_sleeps_on_the_future(sleeps):
    rank = Waiting(held_elsewhere=True)
    _after(0.005, rank.post)
    _after(0.050, lambda: rank.future.set_result("by the poller"))
    t0 = time.perf_counter()
    rank.wait()
    assert rank.future.result() == "by the poller"
    assert rank.drained_by == []
    # it slept on the future once the stamp was there (1 ms at a time) instead of spinning
    # for its whole budget (60 s)
    assert sleeps and all(t == 1e-3 for t in sleeps)
    assert time.perf_counter() - t0 < 30.0


def test_a_waiter_on_a_communicator_not_started_does_not_drain(sleeps):
    rank = Waiting()
    rank.post()
    rank.state.phase = Phase.CLOSED
    rank.wait()
    assert not rank.future.done() and rank.drained_by == []


def _polled(rank, watchdog_check=lambda: False):
    late = SimpleNamespace(confirm=lambda: False)
    return PolledRank(0, rank.ctl[0:1], rank.state, rank.cq, rank.sub, late,
                      SimpleNamespace(check=watchdog_check), launcher=None, tracer=None,
                      persistent=False)


def test_only_a_waiter_that_saw_its_future_done_counts_as_a_helper(sleeps, monkeypatch):
    """The poller sleeps while every busy communicator has, or just had, a thread draining
    for itself; a thread that gave up waiting (its spin budget over) waits for the poller,
    so it must not count as one."""
    gave_up = Waiting()
    monkeypatch.setattr(CollectiveFuture, "SPIN_SECONDS", 0.01)
    gave_up.wait()       # no stamp comes
    assert not gave_up.future.done() and gave_up.cq.helped_at == 0.0
    monkeypatch.setattr(CollectiveFuture, "SPIN_SECONDS", 60.0)
    helped = Waiting()
    _after(0.002, helped.post)
    helped.wait()
    assert helped.future.done() and helped.cq.helped_at > 0
    now = time.perf_counter()
    busy = [_polled(gave_up), _polled(helped)]
    assert progress.unhelped_comms(busy, now) == busy[:1]
    assert progress.unhelped_comms(busy[1:], now + progress.HELPED_RECENTLY) == busy[1:]
    helped.cq.helpers = 1        # a thread is waiting on it right now
    assert progress.unhelped_comms(busy[1:], now + 10) == []


def test_the_poller_leaves_a_cq_to_the_thread_draining_it():
    """Taken from under a thread waiting in ``result()``, a completion would make that
    thread sleep on its future until woken (a thread hand-off)."""
    rank = Waiting()
    polled = _polled(rank)
    rank.post()
    assert polled.needs_polling()
    rank.cq.helpers = 1
    assert polled.poll_once() is False and not rank.future.done()
    rank.cq.helpers = 0
    assert polled.poll_once() is True and rank.future.done()
    assert not polled.needs_polling()


def test_the_poller_fails_the_rank_on_a_stall_and_on_an_abort():
    rank = Waiting()
    rank.state.world.get_report = lambda: "deadlock: no progress"
    polled = _polled(rank, watchdog_check=lambda: True)
    assert polled.poll_once() is False
    assert type(rank.state.error).__name__ == "DeadlockError"
    with pytest.raises(Exception, match="deadlock: no progress"):
        rank.future.result(timeout=1)
    assert not polled.needs_polling()      # failed: nothing left to poll
    other = Waiting()
    other.ctl["abort"][0] = 1               # a peer's watchdog aborted every rank
    assert _polled(other).poll_once() is False
    assert type(other.state.error).__name__ == "AbortedError"


def test_the_heartbeat_is_refreshed_at_most_every_heartbeat_interval():
    rank = Waiting()
    polled = _polled(rank)
    polled.beat(5, force=True)
    polled.beat(6)
    assert rank.ctl["heartbeat"][0] == 5
    polled.beat(6 + PolledRank.HEARTBEAT_NS)
    assert rank.ctl["heartbeat"][0] == 6 + PolledRank.HEARTBEAT_NS


def test_a_done_callback_that_asks_for_the_result_gets_it_at_once(sleeps, monkeypatch):
    """The waiting thread reads the future's ``finished`` flag, which is set before the
    result; a callback, run inside ``set_result``, must not wait for anything."""
    monkeypatch.setattr(completion.platform, "deferred_frees", _no_hold)
    rank = Waiting()
    seen = []
    rank.future.add_done_callback(lambda f: seen.append(f.result()))
    rank.post()
    t0 = time.perf_counter()
    assert rank.future.result() is rank.buffers[0]
    assert seen == [rank.buffers[0]] and rank.future.finished
    assert time.perf_counter() - t0 < 30.0 and sleeps == []


def _no_hold():
    from contextlib import nullcontext
    return nullcontext()


def test_the_loops_find_the_stamp_their_callers_watch():
    """``wait_for_stamp`` says whether one stamp reached its want within the looks it was
    given; ``wait_for_any_stamp`` names the first of several that did, or -1. Arguments as
    help_until_done and the poller pass them: Python ints, int64 arrays."""
    hostspin.warm_up()
    words = np.zeros(3, np.int64)
    addrs = np.array([words[i:].ctypes.data for i in range(3)], np.int64)
    assert not hostspin.wait_for_stamp(int(addrs[0]), 1, 1000)
    assert hostspin.wait_for_any_stamp(addrs, np.ones(3, np.int64), 1000) == -1
    words[2] = 5
    assert hostspin.wait_for_any_stamp(addrs, np.ones(3, np.int64), 1000) == 2
    words[1] = 1
    assert hostspin.wait_for_any_stamp(addrs, np.ones(3, np.int64), 1000) == 1
    assert hostspin.wait_for_any_stamp(addrs, np.array([9, 9, 6], np.int64), 1000) == -1
    words[0] = 3
    assert hostspin.wait_for_stamp(int(addrs[0]), 3, hostspin.spins_per_call())
    assert not hostspin.wait_for_stamp(int(addrs[0]), 4, 0)
    with pytest.raises(ValueError, match="one length"):
        hostspin.wait_for_any_stamp(addrs, np.ones(2, np.int64), 1)


def test_a_call_watches_for_a_bounded_time():
    """``spins_per_call`` sizes a call to about ``CALL_SECONDS`` on this CPU: a call on a
    stamp that never comes returns (a load can only make it shorter or preempt it; the
    bound is generous), and it makes at least the minimum of looks."""
    spins = hostspin.spins_per_call()
    assert spins >= 1000
    word = np.zeros(1, np.int64)
    t0 = time.perf_counter()
    assert not hostspin.wait_for_stamp(word.ctypes.data, 1, spins)
    assert time.perf_counter() - t0 < 2.0


def test_a_waiting_loop_lets_other_threads_run():
    """The loop runs without the GIL: the thread that posts the stamp runs Python while the
    waiter looks, and the waiter sees it. Holding the GIL, the loop would spend all its
    looks (5 * 10**9: 2 s here) before the poster could run, and return False."""
    word = np.zeros(1, np.int64)

    def post():
        time.sleep(0.05)
        word[0] = 7

    poster = threading.Thread(target=post)
    poster.start()
    assert hostspin.wait_for_stamp(int(word.ctypes.data), 7, 5 * 10**9)
    poster.join()


def test_threads_that_wait_at_once_before_the_loops_exist_all_get_them(monkeypatch):
    """Every waiter's call asks for the compiled loops; the first compiles them under a
    lock while the others wait for the whole set, never a part of it."""
    monkeypatch.setattr(hostspin, "_loops", None)
    word = np.ones(1, np.int64)
    answers, start = [], threading.Barrier(8)

    def wait():
        start.wait()
        answers.append(hostspin.wait_for_stamp(int(word.ctypes.data), 1, 10))

    threads = [threading.Thread(target=wait) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert answers == [True] * 8
