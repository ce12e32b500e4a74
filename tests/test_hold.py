"""The host's hold on a daemon (``Communicator.hold_daemon``): what pydfccl.torch takes while a
stream waits on a collective, so that the daemon never needs a relaunch then."""

import pydfccl
import workers
from pydfccl import platform
from pydfccl.sched.policies import get_policy


def test_a_held_daemon_outlives_its_quit_time_and_quits_once_released():
    quit_after = get_policy("dfccl").param_array(platform.SIMULATOR)[3] / 1e9
    seconds = 10 * quit_after if platform.SIMULATOR else 0.1
    per_rank = pydfccl.launch(workers.held_daemon, 2, args=(seconds,))
    for out in per_rank:
        assert out["unheld"] == 0                      # nothing to do: never launched
        assert out["held"]["running"] and out["held"]["quits"] == 0
        assert not any(out["held"]["marks"])             # a held block unmarks itself
        assert out["total"] == [3.0] * 4               # a held daemon still runs the work
        assert not out["running_after"]                # released: it quit
        assert all(out["marks_after"])                 # marked before it read the hold


def test_a_held_launch_that_lost_a_block_ends_whole_and_is_relaunched():
    quit_after = get_policy("dfccl").param_array(platform.SIMULATOR)[3] / 1e9
    seconds = 4 * quit_after if platform.SIMULATOR else 0.05
    (out,) = pydfccl.launch(workers.held_launch_losing_a_block, 1, args=(seconds,))
    assert out["before"] == 1 and out["after"] == 2, out


def test_completions_the_host_has_not_drained_launch_no_daemon():
    """The launch loop relaunches a daemon for runs not yet finished on the device, not for
    finished ones that the host has yet to drain (a busy host, or a poller waiting for the
    GIL): on the H200 (2026-12-01 00:43) three ranks' daemons were launched every 10 to
    17 ms for 1.4 s after their runs were done."""
    quit_after = get_policy("dfccl").param_array(platform.SIMULATOR)[3] / 1e9
    seconds = 10 * quit_after if platform.SIMULATOR else 0.1
    per_rank = pydfccl.launch(workers.undrained_completions, 2, args=(seconds,))
    for out in per_rank:
        assert out["total"] == [3.0] * 4
        assert out["stamped"] == 1 and out["waited"] == 1, out
