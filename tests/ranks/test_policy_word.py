"""The policy interface on the engine: budgets that follow the collective's priority, and a
word per task (``remember``) that survives preemption and reload in the saved context.

The ``counting`` policy (``word_policy.py``) gives a load the budget BASE << priority plus
STEP for each earlier preemption of the run, which its word counts. Every preemption in the
daemons' event logs carries the budget that ran out, so each must be the one the word and
the priority give; and each run ends with its word equal to its preemptions. Rank 1 holds
its submissions back, so rank 0's daemon preempts each collective pass after pass, and
quits and is relaunched meanwhile: the word lives in the task's saved context, which a
relaunch reads back too."""

import pydfccl
import shared_workers
import word_policy

NCOLLS, COUNT = 3, 500


def test_budgets_follow_priority_and_the_word_survives_reloads():
    per_rank = pydfccl.launch(word_policy.held_then_opposite, 2, args=(NCOLLS, COUNT, 0.5),
                              policy=word_policy.counting, timeout=300)
    for k in range(NCOLLS):
        want = sum(shared_workers.rank_inputs(r, COUNT, "int64", k) for r in range(2)).tolist()
        assert all(out["results"][k] == want for out in per_rank), k
    budgets = {}                 # priority -> the first budget of a run at that priority
    reloaded = 0
    for rank, out in enumerate(per_rank):
        assert out["lost"] == 0
        preempted = {}
        for e in sorted(out["trace"], key=lambda e: e["t_ns"]):
            if e["event"] != "preempted" or e["block"] != 0:
                continue
            k = e["coll"]            # collective k runs at priority k
            before = preempted.get(k, 0)
            assert e["waited_ns"] == word_policy.expected_budget(
                word_policy.counting, k, before, simulator=out["simulator"]), (rank, e)
            if before == 0:
                budgets[k] = e["waited_ns"]
            preempted[k] = before + 1
            reloaded += before > 0
        assert out["memo"] == [preempted.get(k, 0) for k in range(NCOLLS)], (rank, out["memo"])
    assert reloaded > 0, "no run was preempted twice: the word was never read back"
    # rank 0 preempted every collective while rank 1 held back: one first budget each
    assert sorted(budgets) == list(range(NCOLLS)), budgets
    assert len(set(budgets.values())) == NCOLLS, budgets
