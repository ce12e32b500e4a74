"""The launcher (``pydfccl.host.launcher``): relaunches a quit daemon while work is undone,
keeps its rule (work undone implies a daemon on its way), and says so loudly when broken.

The unit tests drive a ``Launcher`` with a stand-in kernel, a Python function that
``platform.launch`` runs on the launch thread (the simulator's way), so no GPU is needed."""

import threading
import time

import pytest

import pydfccl
import rank_workers
from pydfccl import platform
from pydfccl.errors import PydfcclError
from pydfccl.host.launcher import Launcher, LauncherError, LaunchState
from pydfccl.sched.policies import get_policy
from waiting import wait_until



class Rank:
    """What a communicator gives its launcher: a lock, the undone count, the activity
    counter, and a 'kernel' that finishes ``per_launch`` runs each time it is launched."""

    def __init__(self, undone=0, per_launch=1, progress=True):
        self.lock = threading.Lock()
        self.undone, self.per_launch, self.progress = undone, per_launch, progress
        self.activity, self.kernel_runs, self.errors = 0, 0, []
        self.wanted = True

    def kernel(self, *args):
        self.kernel_runs += 1
        with self.lock:
            done = min(self.undone, self.per_launch)
            self.undone -= done
        if self.progress:
            self.activity += 1
        time.sleep(0.002)

    def launcher(self, stream=None):
        return Launcher(0, self.lock, lambda: self.undone, lambda: self.activity,
                        lambda: self.wanted, stream, (self.kernel, ()), True,
                        self.errors.append)


def stop(rank, launcher):
    with rank.lock:
        rank.wanted = False
    launcher.stop()


def test_the_daemon_is_relaunched_until_nothing_is_undone_then_the_launcher_is_idle():
    rank = Rank(undone=3, per_launch=1)
    launcher = rank.launcher()
    launcher.start()
    assert wait_until(lambda: launcher.state is LaunchState.IDLE and rank.undone == 0)
    assert rank.kernel_runs == 3 and launcher.launches == 3 and not rank.errors
    with rank.lock:                       # new work wakes it
        rank.undone = 1
        launcher.notify()
    assert wait_until(lambda: rank.undone == 0 and launcher.state is LaunchState.IDLE)
    stop(rank, launcher)
    assert launcher.state is LaunchState.STOPPED and not launcher.thread_alive


def test_a_daemon_that_quit_stuck_is_relaunched_after_a_bounded_pause():
    rank = Rank(undone=1, per_launch=0, progress=False)     # it never gets anywhere
    launcher = rank.launcher()
    launcher.start()
    assert wait_until(lambda: rank.kernel_runs >= 20)        # pauses of at most 10 ms
    assert not rank.errors
    launcher.check()                                         # paused and relaunched: the rule
    stop(rank, launcher)


def test_going_idle_with_work_undone_breaks_the_rule_at_once():
    rank = Rank(undone=2)
    launcher = rank.launcher()
    with rank.lock, pytest.raises(LauncherError, match="went idle with 2 run"):
        launcher._set(LaunchState.IDLE, "a bug")


def test_check_names_a_launch_that_was_lost():
    rank = Rank(undone=1)
    launcher = rank.launcher()           # never started: idle, yet work is undone
    launcher._since -= 30                # idle long before the work came: not yet owed
    launcher.check()                     # first seen: the launcher may be waking up now
    launcher.check()
    launcher._owed = (launcher._owed[0], launcher._owed[1] - 2.0)   # a second later
    with pytest.raises(LauncherError, match="1 run.* undone and no daemon on its way"):
        launcher.check()
    with rank.lock:
        rank.undone = 0
    launcher.check()                     # nothing undone: nothing owed
    assert launcher._owed is None


def test_check_gives_a_starved_launch_thread_time_but_names_one_that_looks_and_waits():
    """A loaded machine can keep the launch thread from the CPU or the GIL for seconds: not
    a lost launch while the thread has not looked since the work came, but one once it has
    looked for a second without launching, or has not looked for a minute."""
    rank = Rank(undone=1)
    launcher = rank.launcher()
    parked = threading.Event()
    launcher._thread = threading.Thread(target=parked.wait)   # alive, never looking
    launcher._thread.start()
    try:
        launcher.state = LaunchState.PAUSED
        launcher.check()                                      # first seen
        owed_at = launcher._owed[1]
        launcher._owed = (launcher._owed[0], owed_at - 5.0)   # owed for 5 s
        launcher.check()                                      # the thread has not looked
        launcher._looked = owed_at - 3.0                      # it looked 2 s after: lost
        with pytest.raises(LauncherError, match="its thread last looked"):
            launcher.check()
        launcher._looked = 0.0
        launcher._owed = (launcher._owed[0], owed_at - 61.0)  # a minute without looking
        with pytest.raises(LauncherError, match="with work for 6[01]"):
            launcher.check()
    finally:
        parked.set()
        launcher._thread.join()


def test_a_launch_that_fails_fails_the_communicator_and_stops():
    rank = Rank(undone=1)

    def broken(*args):
        raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")

    launcher = Launcher(0, rank.lock, lambda: rank.undone, lambda: rank.activity,
                        lambda: rank.wanted, None, (broken, ()), True, rank.errors.append)
    launcher.start()
    assert wait_until(lambda: rank.errors)
    assert isinstance(rank.errors[0], PydfcclError)
    assert "daemon launch failed" in str(rank.errors[0])
    assert "OUT_OF_RESOURCES" in str(rank.errors[0])
    assert wait_until(lambda: launcher.state is LaunchState.STOPPED)
    launcher.check()                     # stopped: it owes nothing
    stop(rank, launcher)


def test_status_names_a_launch_call_that_does_not_return():
    rank = Rank(undone=1)
    launcher = rank.launcher()
    with rank.lock:
        launcher._set(LaunchState.LAUNCHING, "launch 1")
        launcher._since -= 30
        view = launcher.view()
    assert view["state"] == "launching" and "has not returned" in view["note"]
    assert any("launching: launch 1" in line for line in launcher.log())


def test_notify_wakes_a_waiting_launcher_and_counts_its_waiters():
    """``run()`` notifies the launcher on every submission; the notify is skipped unless a
    thread waits, so the count must be up for exactly as long as one does."""
    rank = Rank()
    launcher = rank.launcher()
    counts = []

    def waiter():
        with rank.lock:
            launcher._wait(120.0)
            counts.append(launcher._waiters)

    thread = threading.Thread(target=waiter)
    t0 = time.perf_counter()
    thread.start()
    assert wait_until(lambda: launcher._waiters == 1)
    with rank.lock:
        launcher.notify()
    thread.join(120)
    assert counts == [0]                     # counted while it waited, uncounted once woken
    assert time.perf_counter() - t0 < 60     # by the notify, not its 120 s timeout


def test_completions_the_host_has_not_drained_launch_no_daemon():
    """The launcher relaunches a daemon for runs not yet finished on the device, not for
    finished ones that the host has yet to drain (a busy host, or a poller waiting for the
    GIL): counted as work, they kept idle ranks' daemons relaunching every 10 to 17 ms on
    an H200."""
    quit_after = get_policy("dfccl").param_array(platform.SIMULATOR)[3] / 1e9
    seconds = 10 * quit_after if platform.SIMULATOR else 0.1
    per_rank = pydfccl.launch(rank_workers.undrained_completions, 2, args=(seconds,))
    for out in per_rank:
        assert out["total"] == [3.0] * 4
        # launches before the stamp depend on the machine's speed (a daemon that quits
        # while its peer is slow to submit is relaunched, rightly); none may come after it
        assert out["stamped"] >= 1 and out["waited"] == out["stamped"], out
