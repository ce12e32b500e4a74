"""Short soak and fault cases: extreme budgets, more runs than the queue holds, steady
resources over many collectives (the long forms run on a GPU)."""

import pytest

import pydfccl
import workers

NEVER_QUICK = 10**15   # ns: a budget no wait here reaches


@pytest.mark.parametrize("policy", [
    pydfccl.get_policy("fixed").with_params(THRESHOLD=1),       # preempt at every miss
    pydfccl.get_policy("dfccl").with_params(BASE=1, FACTOR=1),
    pydfccl.get_policy("dfccl").with_params(BASE=NEVER_QUICK),  # never preempt
], ids=["fixed-1ns", "dfccl-1ns", "dfccl-huge"])
def test_extreme_budgets_still_complete_exactly(policy):
    ncolls, count = 3, 200
    per_rank = pydfccl.launch(workers.opposite_orders, 2, args=(ncolls, count), policy=policy,
                              timeout=300)
    for out in per_rank:
        for k in range(ncolls):
            want = sum(workers._inputs(r, count, "int64", k) for r in range(2))
            assert out["results"][k] == want.tolist()


def test_more_runs_than_the_queue_holds_are_queued_not_dropped():
    runs = 300   # > SQ_CAP (256)
    per_rank = pydfccl.launch(workers.many_runs_without_waiting, 2, args=(runs,), timeout=600)
    for out in per_rank:
        assert out["results"] == [2 * i + 1 for i in range(runs)]
        assert out["order"] == list(range(runs))
        assert out["stats"]["completed"] == runs


def test_threads_and_launches_stay_bounded():
    (out,) = pydfccl.launch(workers.steady_resources, 1, args=(400,), timeout=300)
    assert len(set(out["threads"])) == 1, out["threads"]
    assert out["stats"]["completed"] == 400
    assert out["stats"]["launches"] <= 400
