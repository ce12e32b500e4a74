"""How a thread waiting in ``Future.result()`` learns of its completion: the host logic of
``Communicator._help_until_done`` alone, on a stand-in for the communicator whose CQ stamp
a thread of the test writes (under the simulator the real one does not spin at all)."""

import threading
import time

import numpy as np
import pytest

from pydfccl.host import communicator


class StandIn:
    """What ``_help_until_done`` uses of a communicator: one CQ stamp, and a drain that
    completes the future once the stamp is there (unless another thread "holds" it)."""

    _help_until_done = communicator.Communicator._help_until_done

    def __init__(self, drain_held_elsewhere: bool):
        self._state = "started"
        self._helpers = 0
        self._helped_at = 0.0
        self.stamp = np.zeros(1, np.int64)
        self.future = communicator.CollectiveFuture(self)
        self.held_elsewhere = drain_held_elsewhere
        self.drained_by = []

    def _next_stamp(self):
        return self.stamp.ctypes.data, 1

    def _drain_cq(self) -> int:
        if self.held_elsewhere or self.stamp[0] < 1:
            return 0
        self.drained_by.append(threading.get_ident())
        self.future.set_result("done")
        return 1


def _after(seconds, fn):
    timer = threading.Timer(seconds, fn)
    timer.start()
    return timer


@pytest.fixture
def sleeps(monkeypatch):
    """The waiter's sleeps on its future, counted; the spin budget a GPU gives it."""
    calls = []
    real = communicator.wait_for_futures

    def counted(futures, timeout):
        calls.append(timeout)
        return real(futures, timeout=timeout)

    monkeypatch.setattr(communicator, "wait_for_futures", counted)
    monkeypatch.setattr(communicator.CollectiveFuture, "SPIN_SECONDS", 2.0)
    return calls


def test_a_waiter_that_sees_its_stamp_drains_it_itself(sleeps):
    comm = StandIn(drain_held_elsewhere=False)
    _after(0.005, lambda: comm.stamp.__setitem__(0, 1))
    comm._help_until_done(comm.future, None)
    assert comm.future.done()
    assert comm.drained_by == [threading.get_ident()]
    assert sleeps == []          # it never waited for another thread to drain


def test_a_waiter_whose_stamp_another_thread_drains_sleeps_on_the_future(sleeps):
    comm = StandIn(drain_held_elsewhere=True)
    _after(0.005, lambda: comm.stamp.__setitem__(0, 1))
    _after(0.050, lambda: comm.future.set_result("by the poller"))
    t0 = time.perf_counter()
    comm._help_until_done(comm.future, None)
    assert comm.future.result() == "by the poller"
    assert comm.drained_by == []
    # it slept on the future once the stamp was there (1 ms at a time) instead of spinning
    assert sleeps and all(t == 1e-3 for t in sleeps)
    assert time.perf_counter() - t0 < 1.0


def test_only_a_waiter_that_saw_its_future_done_counts_as_a_helper(sleeps, monkeypatch):
    """The poller sleeps while every busy communicator has, or just had, a thread draining
    for itself; a thread that gave up waiting (its spin budget over) waits for the poller,
    so it must not count as one."""
    from pydfccl.host import poller as progress

    gave_up = StandIn(drain_held_elsewhere=False)
    monkeypatch.setattr(communicator.CollectiveFuture, "SPIN_SECONDS", 0.01)
    gave_up._help_until_done(gave_up.future, None)       # no stamp comes
    assert not gave_up.future.done() and gave_up._helped_at == 0.0
    helped = StandIn(drain_held_elsewhere=False)
    _after(0.002, lambda: helped.stamp.__setitem__(0, 1))
    helped._help_until_done(helped.future, None)
    assert helped.future.done() and helped._helped_at > 0
    now = time.perf_counter()
    assert progress.unhelped_comms([gave_up, helped], now) == [gave_up]
    assert progress.unhelped_comms([helped], now + progress.HELPED_RECENTLY) == [helped]
    helped._helpers = 1        # a thread is waiting on it right now
    assert progress.unhelped_comms([helped], now + 10) == []


def test_the_poller_leaves_a_cq_to_the_thread_draining_it():
    """Taken from under a thread waiting in ``result()``, a completion would make that
    thread sleep on its future until woken (a thread hand-off)."""

    class PolledStandIn:
        _poll_once = communicator.Communicator._poll_once
        _unconfirmed: dict = {}
        _row = {"abort": [0]}
        _state = "started"
        persistent = False
        _watchdog = type("Quiet", (), {"check": staticmethod(lambda: False)})()

        def __init__(self):
            self._helpers = 0
            self.drains = 0

        def _drain_cq(self) -> int:
            self.drains += 1
            return 1

    comm = PolledStandIn()
    comm._helpers = 1
    assert comm._poll_once() is False and comm.drains == 0
    comm._helpers = 0
    assert comm._poll_once() is True and comm.drains == 1


def test_a_done_callback_that_asks_for_the_result_gets_it_at_once(sleeps):
    """The waiting thread reads the future's ``finished`` flag, which is set before the
    result; a callback, run inside ``set_result``, must not wait for anything."""
    comm = StandIn(drain_held_elsewhere=False)
    seen = []
    comm.future.add_done_callback(lambda f: seen.append(f.result()))
    comm.stamp[0] = 1
    t0 = time.perf_counter()
    assert comm.future.result() == "done"
    assert seen == ["done"] and comm.future.finished
    assert time.perf_counter() - t0 < 0.5 and sleeps == []


def test_warm_up_loads_the_loops_the_waiters_call():
    """``Communicator.start`` loads both compiled loops (hostspin.warm_up) so that the first
    ``result()`` does not: their callers' arguments then find a loaded overload, and no
    call compiles or loads another."""
    from pydfccl.host import hostspin

    hostspin.warm_up()
    loaded = (len(hostspin.wait_for_stamp.overloads), len(hostspin.wait_for_any_stamp.overloads))
    assert loaded[0] >= 1 and loaded[1] >= 1
    word = np.ones(1, np.int64)
    # as _help_until_done and the poller pass them: Python ints, int64 arrays
    assert hostspin.wait_for_stamp(int(word.ctypes.data), 1, hostspin.SPINS_PER_CALL)
    assert hostspin.wait_for_any_stamp(np.array([word.ctypes.data], np.int64),
                                       np.array([1], np.int64), hostspin.SPINS_PER_CALL) == 0
    assert (len(hostspin.wait_for_stamp.overloads),
            len(hostspin.wait_for_any_stamp.overloads)) == loaded
