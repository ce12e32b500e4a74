"""The catalog of a rank's registrations (``host.catalog``) and its phase
(``host.rankstate``): prepare's checks, the table records start writes, and the names
reports give collectives."""

import pytest

from pydfccl.errors import PydfcclError
from pydfccl.host.catalog import Catalog
from pydfccl.host.rankstate import Phase, RankState
from pydfccl.host.world_config import WorldConfig
from pydfccl.protocol import layout as L


def _catalog(rank=0, nranks=3, **sizes):
    return Catalog(WorldConfig(nranks, simulator=True, **sizes), rank, nranks)


def _add(catalog, coll_id, kind="all_reduce", count=4, peer=None, **kw):
    spec = catalog.new_spec(coll_id, kind, count, kw.get("dtype", "float32"),
                            kw.get("op", "sum"), kw.get("root", 0), 0, peer)
    catalog.specs[coll_id] = spec
    return spec


@pytest.mark.parametrize("args, message", [
    (dict(coll_id=-1), "non-negative int"),
    (dict(count=-1), "collective 5: count must be a non-negative int, got -1"),
    (dict(count=2**63), "collective 5: count 9223372036854775808 is too large"),
    (dict(priority=2**21), "collective 5: priority must be at most 1048576"),
    (dict(root=3), "root 3 out of range 0..2"),
    (dict(kind="send"), "needs peer= another rank"),
    (dict(kind="recv", peer=0), "needs peer= another rank"),
    (dict(peer=1), "peer= is for send and recv"),
])
def test_prepare_refuses_what_the_daemon_could_not_run(args, message):
    call = dict(coll_id=5, kind="all_reduce", count=4, dtype="float32", op="sum", root=0,
                priority=0, peer=None)
    call.update(args)
    with pytest.raises(ValueError, match=message):
        _catalog().new_spec(**call)


@pytest.mark.parametrize("name, value", [("coll_id", True), ("coll_id", 5.0),
                                         ("count", True), ("count", 4.0), ("root", False),
                                         ("root", 0.0), ("priority", True),
                                         ("priority", 1.5), ("peer", 1.0)])
def test_prepare_refuses_bools_and_floats_where_an_int_belongs(name, value):
    call = dict(coll_id=5, kind="send" if name == "peer" else "all_reduce", count=4,
                dtype="float32", op="sum", root=0, priority=0, peer=1 if name == "peer" else None)
    call[name] = value
    with pytest.raises(TypeError, match=rf"{name} must be an int, got {value!r} "
                                        rf"\({type(value).__name__}\)"):
        _catalog().new_spec(**call)


def test_count_zero_is_a_collective_with_an_entry():
    catalog = _catalog()
    spec = _add(catalog, 3, count=0)
    assert spec.count == 0 and spec.sizes(3) == (0, 0)
    assert catalog.place_all({3: 0}, {3: 0})[0]["count"] == 0


def test_an_id_is_prepared_once_and_more_than_max_colls_may_be():
    catalog = _catalog(max_colls=2)
    _add(catalog, 0)
    with pytest.raises(ValueError, match="already prepared"):
        _add(catalog, 0)
    for coll_id in range(1, 20):     # beyond the slots they share them (host/slots.py)
        _add(catalog, coll_id)
    assert len(catalog.specs) == 20


def test_a_transfer_keeps_its_peer_where_a_chain_keeps_its_root():
    spec = _add(_catalog(), 7, kind="send", peer=2)
    assert spec.root == 2 and spec.signature()["kind"] == "send"


def test_start_places_every_ranks_collectives_and_writes_this_ranks_records():
    catalog = _catalog()
    _add(catalog, 4)
    _add(catalog, 9, kind="broadcast", root=1)
    table = catalog.place_all({4: 0, 6: 1, 9: 2}, {4: 0, 6: 1, 9: 3})
    assert catalog.index == {4: 0, 9: 2} and catalog.by_index == {0: 4, 1: 6, 2: 9}
    assert table.dtype == L.COLL_ENTRY and len(table) == L.MAX_COLLS
    assert table[2]["root"] == 1 and table[2]["conn"] == 3 and table[2]["count"] == 4
    assert table[1]["count"] == 0        # another rank's transfer: no record here
    assert set(catalog.signatures()) == {4, 9}
    assert "one_shot" in catalog.signatures()[4]


def test_reports_name_a_transfer_by_the_end_each_rank_runs():
    catalog = _catalog(rank=0)
    _add(catalog, 3, kind="send", peer=1)
    catalog.place(3, 5)
    assert catalog.describe(5) == "send 3"
    assert catalog.describe(5, rank=1) == "recv 3"
    assert catalog.describe(6) == "collective #6"
    catalog.place(8, 6)                  # placed, but not registered on this rank
    assert catalog.describe(6) == "collective 8"


def test_each_call_is_allowed_in_its_phase_only():
    state = RankState(world=None, rank=0, lock=None, fail_runs=lambda error: None)
    state.require(Phase.PREPARING, "start")
    state.phase = Phase.STARTED
    assert state.started
    with pytest.raises(PydfcclError, match=r"start\(\) is only allowed before start\(\); "
                                           "this communicator is started"):
        state.require(Phase.PREPARING, "start")
    state.phase = Phase.CLOSED
    assert not state.started
    with pytest.raises(PydfcclError, match="after start.* and before close.*is closed"):
        state.require(Phase.STARTED, "run")
