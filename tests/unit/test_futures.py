"""CollectiveFuture: a concurrent.futures.Future whose condition is made only when needed.

Each test finishes a future from one thread while another uses it the way users do
(blocking ``result``, ``wait``, ``as_completed``, callbacks), so a finish that skipped the
condition while someone needed it would hang or miss a callback here."""

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, as_completed, wait

import pytest

from pydfccl.host.futures import CollectiveFuture


class _Queue:
    """What a future asks of its completion queue: help while waiting (nothing to drain
    here)."""

    def help_until_done(self, future, timeout):
        pass


def _future():
    return CollectiveFuture(_Queue(), running=True)


def _finish_later(future, value, delay=0.05):
    t = threading.Timer(delay, future.set_result, args=(value,))
    t.start()
    return t


def test_it_is_a_concurrent_future_with_the_base_class_state():
    future = _future()
    assert isinstance(future, Future)
    # a Python whose Future keeps more state than this one sets would break the base
    # class's methods: compare with a real one
    base = set(vars(Future())) - {"_condition"}
    assert base <= set(vars(future)), base - set(vars(future))
    assert future.running() and not future.done()
    assert not future.cancel()          # a submitted collective cannot be taken back


def test_finished_with_nobody_waiting_makes_no_condition():
    future = _future()
    future.set_result(7)
    assert future.done() and future.result() == 7 and future.exception() is None
    assert future._lazy_condition is None
    assert "finished" in repr(future)


def test_a_thread_blocked_in_result_is_woken():
    future = _future()
    timer = _finish_later(future, "x")
    assert Future.result(future, timeout=5) == "x"   # the base class's blocking wait
    timer.join()


def test_wait_and_as_completed_see_the_finish():
    futures = [_future() for _ in range(3)]
    timers = [_finish_later(f, i, delay=0.02 * (i + 1)) for i, f in enumerate(futures)]
    done, _ = wait(futures[:1], timeout=5, return_when=FIRST_COMPLETED)
    assert done == {futures[0]}
    assert sorted(f.result() for f in as_completed(futures, timeout=5)) == [0, 1, 2]
    for t in timers:
        t.join()


@pytest.mark.parametrize("before", [True, False])
def test_callbacks_run_once_whether_added_before_or_after_the_finish(before):
    future, seen = _future(), []
    if before:
        future.add_done_callback(lambda f: seen.append(f.result()))
        future.set_result(3)
    else:
        future.set_result(3)
        future.add_done_callback(lambda f: seen.append(f.result()))
    assert seen == [3]
    assert future.has_callbacks


def test_an_exception_raises_from_result():
    future = _future()
    future.set_exception(RuntimeError("boom"))
    with pytest.raises(RuntimeError, match="boom"):
        future.result()
    assert isinstance(future.exception(), RuntimeError)


def test_a_second_finish_is_refused():
    future = _future()
    future.set_result(1)
    with pytest.raises(Exception, match="FINISHED"):
        future.set_result(2)
    assert future.result() == 1


def test_finishes_racing_waiters_never_lose_a_wakeup():
    """Many rounds of a finish racing a blocking wait that makes the condition."""
    for _ in range(300):
        future = _future()
        got = []
        waiter = threading.Thread(target=lambda: got.append(Future.result(future, timeout=5)))
        waiter.start()
        time.sleep(0)
        future.set_result(1)
        waiter.join(timeout=10)
        assert got == [1]


def test_a_timeout_names_the_collective_and_keeps_the_run_in_flight():
    class Rank2Queue(_Queue):
        rank, outstanding = 2, 3

    future = CollectiveFuture(Rank2Queue(), running=True, coll_id="grads")
    for wait_for in (future.result, future.exception):
        with pytest.raises(TimeoutError, match=r"rank 2: collective 'grads' did not complete "
                           r"within 0.05 s \(3 run\(s\) of this rank outstanding\); it is "
                           r"still in flight"):
            wait_for(timeout=0.05)
    future.set_result("done")           # the run completes later: a second wait gets it
    assert future.result(timeout=1) == "done"
