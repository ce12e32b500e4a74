"""What the poller concludes when a late registration's peers have not published it
(``host.late_registration.LateRegistrations.confirm``): a peer that closed without it is
the cause, unless that peer closed because another rank had already aborted the job."""

import threading
import time

import numpy as np

from pydfccl.errors import AbortedError
from pydfccl.host.late_registration import LateRegistrations
from pydfccl.host.rankstate import Phase, RankState
from pydfccl.host.submission import Submissions
from pydfccl.protocol import layout as L
from pydfccl.protocol.codes import dtype_code, kind_code, op_code


class _World:
    """The shared words ``confirm`` reads: control rows and the abort report."""

    def __init__(self, nranks):
        self.nranks = nranks
        self.ctl = np.zeros(nranks, L.CTL_ROW)
        self.report = ""

    def get_report(self):
        return self.report

    def abort_with(self, report):
        self.report = self.report or report
        self.ctl["abort"] = 1
        return self.report


class _Spec:
    coll_id, kind, count, dtype = 0, "all_reduce", 4, "float32"


class _Catalog:
    def spec_at(self, index):
        return _Spec()


def _publish(world, rank, index=0):
    row = world.ctl["registered"][rank]
    row[index] = (1, 0, kind_code("all_reduce"), dtype_code("float32"), op_code("sum"), 4, 0, 0)


def _confirm_with_rank_2_closed(report):
    """Rank 0 and 1 published collective 0; rank 2 closed without it."""
    world, lock = _World(3), threading.RLock()
    submissions = Submissions(world.ctl, 0, lock)
    state = RankState(world, 0, lock, submissions.fail_all)
    state.phase = Phase.STARTED
    late = LateRegistrations(world, 0, lock, _Catalog(), submissions, state, timeout=60.0)
    _publish(world, 0)
    _publish(world, 1)
    world.ctl["heartbeat"][2] = -1
    world.report = report
    submissions.hold(0, time.monotonic())
    assert late.confirm() is False
    return state.error, world.report


def test_a_peer_that_closed_without_publishing_is_named():
    error, report = _confirm_with_rank_2_closed("")
    assert isinstance(error, ValueError)
    assert "ranks [2] closed their communicator without preparing it" in str(error)
    assert report.startswith("rank 0: collective 0 (all_reduce, count 4, float32)")


def test_a_peer_that_closed_after_another_ranks_abort_is_no_cause():
    cause = "rank 1: collective 3: field 'one_shot' differs across ranks"
    error, report = _confirm_with_rank_2_closed(cause)
    assert isinstance(error, AbortedError) and str(error) == cause
    assert report == cause


def test_a_peer_still_to_publish_is_waited_for():
    world, lock = _World(2), threading.RLock()
    submissions = Submissions(world.ctl, 0, lock)
    state = RankState(world, 0, lock, submissions.fail_all)
    late = LateRegistrations(world, 0, lock, _Catalog(), submissions, state, timeout=60.0)
    _publish(world, 0)
    submissions.hold(0, time.monotonic())
    assert late.confirm() is False
    assert state.error is None and 0 in submissions.held

