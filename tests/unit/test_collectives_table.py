"""Each collective kind is defined once (protocol/collectives.py): the kind lists, the
registry's connector sets, the buffers and expected outputs derive from that definition,
and the daemon's step plans (device code) agree with it."""

import numpy as np
import pytest

from pydfccl.cli.hbm import host_function
from pydfccl.kernels import plans
from pydfccl.protocol import codes
from pydfccl.protocol.collectives import (BY_NAME, COLLECTIVES, LOOP_COUNTED, ONE_SHOT,
                                          ONE_SHOT_STEPS, collective, split_output)
from pydfccl.protocol.one_shot import table_kind
from pydfccl.protocol.reference import buffer_elems, reference
from pydfccl.host.registration import placement

steps_per_loop = host_function(plans.steps_per_loop)
loop_elems = host_function(plans.loop_elems)
step_peers = host_function(plans.step_peers)
plan_step = host_function(plans.plan_step)
RANKS = range(1, 10)


def test_the_kind_lists_come_from_the_table():
    assert codes.KINDS == {c.name: c.code for c in COLLECTIVES}
    assert len(set(codes.KINDS.values())) == len(COLLECTIVES)
    assert set(codes.POINT_TO_POINT) == {"send", "recv"}
    assert (set(codes.COLLECTIVE_KINDS) | set(codes.POINT_TO_POINT)
            | set(codes.PER_PEER_COUNTS)) == set(codes.KINDS)
    assert codes.PER_PEER_COUNTS == ("all_to_allv",)
    assert set(codes.OUT_OF_PLACE_ONLY) == {"all_gather", "reduce_scatter", "all_to_all",
                                            "all_to_allv"}
    assert ONE_SHOT not in codes.KINDS.values()
    assert LOOP_COUNTED == (codes.kind_code("all_to_all"), codes.kind_code("all_to_allv"))
    with pytest.raises(ValueError, match="unknown collective kind 'gossip'"):
        collective("gossip")


@pytest.mark.parametrize("kind", list(BY_NAME))
def test_the_daemons_plans_take_the_tables_steps_and_loop_size(kind):
    c = BY_NAME[kind]
    for n in RANKS:
        assert steps_per_loop(c.code, n) == c.steps(n)
        assert loop_elems(c.code, n, 16) == (n * 16 if c.ring_loop else 16)
        assert table_kind(kind, 1 << 20, 4, n, 1 << 16) == c.code
    assert all(steps_per_loop(ONE_SHOT, n) == ONE_SHOT_STEPS for n in range(2, 9))


@pytest.mark.parametrize("kind", list(BY_NAME))
def test_a_kind_uses_the_connector_sets_the_registry_gives_it(kind):
    c = BY_NAME[kind]
    for n in range(2, 10):
        sets = {step_peers(c.code, rank, n, (rank + 1) % n, step)[2]
                for rank in range(n) for step in range(c.steps(n))}
        assert sets == set(range(c.connector_sets(n)))
    per_rank = [{0: {"kind": kind}, 1: {"kind": "all_reduce"}}]
    assert placement(per_rank, 5)[1] == {0: 0, 1: c.connector_sets(5)}


@pytest.mark.parametrize("kind", list(BY_NAME))
def test_buffers_and_outputs_follow_the_definitions(kind):
    n, count = 3, 4
    send, recv = buffer_elems(kind, count, n)
    inputs = [np.arange(send, dtype=np.float32) + 100 * r for r in range(n)]
    if BY_NAME[kind].per_peer_counts:      # the run's counts, at most ``count`` each
        with pytest.raises(ValueError, match="use pydfccl.protocol.collectives.split_output"):
            reference(kind, inputs)
        counts = np.full((n, n), count)
        assert [split_output(inputs, counts, rank).size for rank in range(n)] == [recv] * n
        return
    for rank in range(n):
        out = reference(kind, inputs, "max", root=1, rank=rank, nblocks=1, slot_bytes=1024)
        assert out is None or out.size == recv


def test_outputs_are_the_kinds_own():
    n = 3
    inputs = [np.arange(12, dtype=np.float32) + 100 * r for r in range(n)]
    assert np.array_equal(reference("all_gather", inputs, rank=2), np.concatenate(inputs))
    assert np.array_equal(reference("reduce_scatter", inputs, "max", rank=2), inputs[2][8:])
    assert np.array_equal(reference("all_to_all", inputs, rank=1),
                          np.concatenate([x[4:8] for x in inputs]))
    counts = [[1, 2, 0], [0, 0, 5], [3, 3, 3]]     # counts[a][b]: a sends b
    assert split_output(inputs, counts, 1).tolist() == [1, 2, 203, 204, 205]
    assert np.array_equal(reference("broadcast", inputs, root=1, rank=0), inputs[1])
    assert np.array_equal(reference("recv", inputs, root=1, rank=0), inputs[1])
    assert reference("reduce", inputs, root=1, rank=0) is None
    assert reference("send", inputs, root=1, rank=0) is None


def test_the_models_ring_has_the_tables_steps():
    """The model (``sched.steps``) names each step of an all_reduce loop; their number is the
    table's, on every ring size."""
    from pydfccl.sched.steps import ring_steps

    for n in range(2, 10):
        assert len(ring_steps(n)) == BY_NAME["all_reduce"].steps(n)
