"""The network proxy's messages, without MPI: each rank's world in this process, the
proxies joined by an in-memory stand-in for a communicator, their steps driven by hand.
What a daemon writes in the shadow of a peer on another node arrives in that peer's own
pool at the same place (the data, then the counter), a one-shot all_reduce's lane alone;
heads come back; a row reaches its replica, and an abort its report."""

import collections
import time
import types

import numpy as np
import pytest

from pydfccl.host.world import World

from pydfccl.host.world_config import WorldConfig
from pydfccl.protocol import layout as L
from pydfccl.protocol.collectives import ONE_SHOT
from pydfccl.transport.proxy import NetProxy


class _Request:
    def __init__(self, test):
        self.Test = test

    def Cancel(self):
        pass

    def Wait(self):
        pass


class _Status:
    def __init__(self):
        self.count = 0

    def Get_count(self, datatype=None):
        return self.count


MPI = types.SimpleNamespace(BYTE="byte", Status=_Status)


class _Comm:
    """Rank ``rank``'s end of in-memory queues, one a (source, destination) pair."""

    def __init__(self, rank, queues):
        self.rank, self.queues = rank, queues

    def Isend(self, spec, dest, tag):
        self.queues[(self.rank, dest)].append(bytes(spec[0]))
        return _Request(lambda status=None: True)

    def Irecv(self, spec, source, tag):
        buf, queue = spec[0], self.queues[(source, self.rank)]

        def test(status=None):
            if not queue:
                return False
            message = queue.popleft()
            buf[:len(message)] = np.frombuffer(message, np.uint8)
            status.count = len(message)
            return True
        return _Request(test)


NODES = [0, 1, 1]


@pytest.fixture
def ranks(monkeypatch):
    """Three ranks: 0 on node 0, 1 and 2 on node 1 (here each in its own memory). Their
    memory is the simulator's, whichever backend this process imported."""
    from pydfccl.host import world as world_module
    from pydfccl.platform.simulator import SimulatedBuffer

    monkeypatch.setattr(world_module, "HostBuffer", SimulatedBuffer)
    monkeypatch.setattr(world_module, "DeviceBuffer", SimulatedBuffer)
    monkeypatch.setattr(world_module, "backend",
                        types.SimpleNamespace(device_memory_is_host=True))
    cfg = WorldConfig(3, simulator=True)
    queues = collections.defaultdict(collections.deque)
    worlds, proxies = [], []
    for r in range(3):
        world = World(cfg, ctl_mem=np.zeros(cfg.ctl_bytes, np.uint8),
                      pool_mem=np.zeros(3 * cfg.pool_bytes, np.uint8), nodes=NODES,
                      nodes_of=r)
        proxy = NetProxy(world, r, _Comm(r, queues), mpi=MPI)
        for p in proxy.peers:
            proxy._post_recv(p)
        worlds.append(world)
        proxies.append(proxy)
    return cfg, worlds, proxies


def _conn(cfg, conn):
    return L.HEADER_BYTES + conn * cfg.conn_stride


def _word(buf, offset, value=None):
    words = buf.array[offset:offset + 8].view(np.int64)
    if value is not None:
        words[0] = value
    return int(words[0])


def test_only_peers_on_other_nodes_have_shadows_and_proxies(ranks):
    cfg, worlds, proxies = ranks
    assert [p.peers for p in proxies] == [[1, 2], [0], [0]]
    assert worlds[0].transports() == {"ipc": 1, "mpi": 2}
    assert worlds[0].peers.read(0, 24).view(np.int64)[1] == worlds[0].pools[1].addr


def test_a_slot_and_its_tail_arrive_in_the_peers_pool_and_a_head_comes_back(ranks):
    cfg, worlds, proxies = ranks
    base = _conn(cfg, 3)
    slot = base + L.CONN_HEADER_BYTES + 1 * cfg.slot_bytes      # slot 1: the second sent
    shadow = worlds[0].pools[1]                     # rank 0 sends to rank 1
    for value, fill in ((1, 7), (2, 9)):
        at = base + L.CONN_HEADER_BYTES + (value - 1) * cfg.slot_bytes
        shadow.array[at:at + cfg.slot_bytes] = fill
    _word(shadow, base + L.CONN_TAIL, 2)
    assert proxies[0]._forward() == 1
    assert proxies[0].stats["sent_slot"] == 2       # one message a slot the tail covers
    own = worlds[1].pools[1]
    assert _word(own, base + L.CONN_TAIL) == 0      # nothing before it is received
    assert proxies[1]._receive() == 2
    assert _word(own, base + L.CONN_TAIL) == 2
    assert np.all(own.array[slot:slot + cfg.slot_bytes] == 9)
    assert not np.any(worlds[2].pools[1].array)     # rank 2's copy of 1: untouched
    _word(worlds[1].pools[0], base + L.CONN_HEAD, 2)        # rank 1 consumed both
    assert proxies[1]._forward() == 1 and proxies[0]._receive() == 1
    assert _word(worlds[0].pools[0], base + L.CONN_HEAD) == 2
    assert proxies[0]._forward() == 0                # nothing moved since


def test_what_the_proxy_delivers_is_activity_that_relaunches_a_daemon(ranks):
    """A daemon that quit waiting for data from another node is relaunched when the
    activity changes (host/launcher.py): a slot or a credit arriving must change it, not
    only the remote row that comes every ROW_PERIOD."""
    cfg, worlds, proxies = ranks
    worlds[1].net = proxies[1]
    base = _conn(cfg, 2)
    before = worlds[1].activity()
    _word(worlds[0].pools[1], base + L.CONN_TAIL, 1)            # rank 0 sends a slot
    assert proxies[0]._forward() == 1 and proxies[1]._receive() == 1
    after_slot = worlds[1].activity()
    assert after_slot != before and worlds[1].ctl["host_submitted"].sum() == 0
    _word(worlds[2].pools[0], base + L.CONN_HEAD, 1)            # rank 2 returns credit
    assert proxies[2]._forward() == 1 and proxies[0]._receive() == 1
    worlds[0].net = proxies[0]
    assert proxies[0].delivered == 1 and proxies[1].delivered == 1
    assert worlds[1].activity() == after_slot      # nothing new for rank 1


def test_a_one_shot_lane_carries_its_share_of_the_slot_alone(ranks):
    """Rank 0 is rank 2's sender at distance 1 (lane 0) of a one-shot set: its message
    writes lane 0 only, leaving lane 1 (rank 1's, at distance 2) as it was."""
    cfg, worlds, proxies = ranks
    entry = np.zeros(1, L.COLL_ENTRY)
    entry["kind"], entry["conn"] = ONE_SHOT, 5
    worlds[0].pools[0].write(L.P_COLLS, entry)
    lane = cfg.slot_bytes // 2 // 16 * 16
    base = _conn(cfg, 5)
    slot = base + L.CONN_HEADER_BYTES
    worlds[2].pools[2].array[slot:slot + cfg.slot_bytes] = 5       # lane 1 already there
    worlds[0].pools[2].array[slot:slot + cfg.slot_bytes] = 1
    _word(worlds[0].pools[2], base + L.CONN_TAIL, 1)
    proxies[0]._forward()
    proxies[2]._receive()
    got = worlds[2].pools[2].array[slot:slot + cfg.slot_bytes]
    assert np.all(got[:lane] == 1) and np.all(got[lane:] == 5)
    assert _word(worlds[2].pools[2], base + L.CONN_TAIL) == 1


def test_a_row_reaches_its_replica_and_an_abort_its_report(ranks):
    cfg, worlds, proxies = ranks
    row = worlds[0].ctl[0:1]
    row["heartbeat"], row["pid"], row["host_submitted"] = 12345, 4321, 7
    row["blocks"]["progress"][0, 0] = 99
    proxies[0]._send_row()
    before = time.monotonic_ns()
    proxies[1]._receive()
    replica = worlds[1].ctl[0]
    assert replica["pid"] == 4321 and replica["host_submitted"] == 7
    assert replica["blocks"]["progress"][0] == 99
    assert replica["heartbeat"] >= before and replica["pid_ns"] == -1
    assert worlds[1].ctl["abort"][0] == 0
    worlds[0].abort_with("deadlock: a cycle (seen by rank 0)")
    proxies[0]._forward_abort()
    proxies[0]._forward_abort()                     # once
    assert proxies[0].stats["sent_abort"] == 2      # to ranks 1 and 2
    proxies[2]._receive()
    assert worlds[2].get_report() == "deadlock: a cycle (seen by rank 0)"
    assert worlds[2].ctl["abort"].all()
    proxies[2]._forward_abort()
    assert proxies[2].stats["sent_abort"] == 0      # its sender told every node


def test_a_row_older_than_the_replicas_is_dropped(ranks, monkeypatch):
    """A remote rank's rows reach its replica through each proxy of the node, paths in
    order each but not with each other: a row from before the peer started (heartbeat 0),
    delivered after a newer one by a path that lagged, must not set the replica back (a
    stopped peer whose replica said "not started" was never named)."""
    cfg, worlds, proxies = ranks
    row = worlds[0].ctl[0:1]
    proxies[0]._send_row()                                  # before start: heartbeat 0
    row["heartbeat"], row["pid"] = time.monotonic_ns(), 4321
    proxies[0]._send_row()                                  # started
    queue = proxies[0].comm.queues[(0, 1)]
    queue.reverse()                                         # the newer one first
    assert proxies[1]._receive() == 2
    replica = worlds[1].ctl[0]
    assert replica["pid"] == 4321 and replica["heartbeat"] > 0
    assert replica["pid_ns"] == -1
    from pydfccl.host import liveness
    monkeypatch.setattr(liveness, "HEARTBEAT_TIMEOUT", 0.5)
    worlds[1].ctl["heartbeat"][0] = time.monotonic_ns() - 10**9     # silent for 1 s
    assert "on another node" in liveness.dead_peers(worlds[1], 1)[0]


def test_rows_to_a_peer_that_takes_none_do_not_pile_up(ranks):
    """A stopped peer receives nothing, so no row sent to it completes: rank 0 keeps one
    row in flight to it and goes on sending rows to the peer that receives (unbounded,
    20 a second, they exhausted MPI's buffers and silenced rank 0 to everyone); the row
    sent at close, which says the rank closed, goes to every peer."""
    cfg, worlds, proxies = ranks
    proxy = proxies[0]
    stopped = []
    posted = proxy.comm.Isend

    def isend(spec, dest, tag):
        if dest != 2:
            return posted(spec, dest, tag)
        stopped.append(spec)
        return _Request(lambda status=None: False)     # never received

    proxy.comm.Isend = isend
    for _ in range(5):
        proxy._send_row()
        proxy._reap()
    assert len(stopped) == 1
    assert len(proxy.comm.queues[(0, 1)]) == 5          # every row to rank 1
    assert proxies[1]._receive() == 5
    proxy._send_row(last_one=True)      # at close, the row that says so goes to every peer
    assert len(stopped) == 2 and proxies[1]._receive() == 1


def test_a_started_ranks_row_goes_before_its_first_data(ranks):
    """A rank stopped right after its first collective, inside the row period and with
    its row from before it started still in flight, was taken by the other nodes for
    one that never started and never named. Its first slot to a peer now follows a row
    that says it started, at once, on the same in-order path; later data adds none."""
    cfg, worlds, proxies = ranks
    proxy = proxies[0]
    posted = proxy.comm.Isend
    proxy.comm.Isend = lambda spec, dest, tag: (posted(spec, dest, tag),
                                                 _Request(lambda status=None: False))[1]
    proxy._send_row()                                       # before start: heartbeat 0
    worlds[0].ctl[0:1]["heartbeat"], worlds[0].ctl[0:1]["pid"] = time.monotonic_ns(), 4321
    base = _conn(cfg, 3)
    _word(worlds[0].pools[1], base + L.CONN_TAIL, 1)        # the first slot to rank 1
    assert proxy._forward() == 1
    assert proxy.stats["sent_row"] == 3                     # 2 before start, 1 to rank 1
    assert proxies[1]._receive() == 3               # the old row, the new one, the slot
    replica = worlds[1].ctl[0]
    assert replica["pid"] == 4321 and replica["heartbeat"] > 0
    assert _word(worlds[1].pools[1], base + L.CONN_TAIL) == 1
    _word(worlds[0].pools[1], base + L.CONN_TAIL, 2)
    assert proxy._forward() == 1 and proxy.stats["sent_row"] == 3
    assert proxy.stats["sent_slot"] == 2


def test_the_proxy_times_its_writes_and_the_messages_transit(ranks):
    """Each received slot's copy into the pool and each slot's or head's time from the
    sender's proxy to the receiver's are kept until taken; the table pools every rank's by
    size, and shows transit only where the ranks share one machine's clock."""
    from pydfccl.transport.timings import timings_table

    cfg, worlds, proxies = ranks
    base = _conn(cfg, 2)
    _word(worlds[0].pools[1], base + L.CONN_TAIL, 1)
    assert proxies[0]._forward() == 1
    time.sleep(0.01)
    assert proxies[1]._receive() == 1
    taken = proxies[1].timings.take()
    assert taken["pool write"].size == 1 and taken["transit"].size == 1
    assert 10_000 <= taken["transit"][0] < 60e6        # microseconds: the 10 ms slept
    assert all(v.size == 0 for v in proxies[1].timings.take().values())   # taken: afresh
    assert all(v.size == 0 for v in proxies[0].timings.take().values())   # it never looped
    lines = timings_table({8: [None, taken], 512: [None, None]}, one_machine=True)
    assert lines[0].split() == ["bytes", "loop", "gap", "us", "p99", "pool", "write", "us",
                                "p99", "transit", "us", "p99"]
    eight = lines[1].split()
    assert eight[:3] == ["8", "-", "-"] and abs(float(eight[5]) - taken["transit"][0]) <= 0.05
    assert lines[2].split() == ["512"] + ["-"] * 6
    across = timings_table({8: [None, taken]}, one_machine=False)
    assert "transit" not in across[0] and len(across[1].split()) == 5
