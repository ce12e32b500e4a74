"""``Communicator.status()`` as text: one formatter for the demo's status lines (a user's
words) and the stall reports (with the launcher's internals)."""

from pydfccl.host.watchdog import format_status

STATUSES = [
    dict(rank=0, outstanding=2, host_blocked=False, preemptions=3, steps=40,
         blocks=[dict(block=0, coll=7, loop=1, step=2, waits=[(1, "data from")]),
                 dict(block=1, coll=None, loop=0, step=0, waits=[])],
         daemon=dict(state="running", launches=2), launch_log=["launched", "relaunched"]),
    dict(rank=1, outstanding=0, host_blocked=False, preemptions=0, steps=40,
         blocks=[dict(block=0, coll=None, loop=0, step=0, waits=[])]),
]


def test_a_users_status_lines_leave_the_internals_out():
    text = format_status(STATUSES, internals=False)
    assert text.splitlines() == [
        "rank 0: 2 outstanding; 3 preemptions; block 0 on collective 7 (step 2), "
        "waiting for data from rank 1",
        "rank 1: 0 outstanding; 0 preemptions; idle"]


def test_a_stall_report_has_the_loop_and_the_launchers_state():
    lines = format_status(STATUSES).splitlines()
    assert lines[0] == ("rank 0: 2 outstanding; 3 preemptions; block 0 on collective 7 "
                        "(loop 1, step 2), waiting for data from rank 1; daemon launches: "
                        "state running, launches 2")
    assert lines[1:3] == ["    launched", "    relaunched"]
    assert lines[3] == "rank 1: 0 outstanding; 0 preemptions; idle"
