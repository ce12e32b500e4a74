"""The host of every rank, and the refusal of a job whose ranks span hosts: the message
names each host's ranks; ``PYDFCCL_RANKS_PER_NODE`` emulates hosts on one machine, by the
job's rank (a subgroup's ranks are not the job's)."""

import socket

import pytest

from pydfccl import PydfcclError, SpansHostsError
from pydfccl.bootstrap.topology import RANKS_PER_NODE, check_one_host, rank_hosts, this_host


class _Group:
    """What the topology needs of a group: a rank, a size and an allgather, here of the
    hosts the peers report (``peer_hosts``, else this rank's own for every rank)."""

    def __init__(self, rank, size, peer_hosts=None):
        self.rank, self.size = rank, size
        self.peer_hosts = peer_hosts
        self.gathered = []

    def allgather(self, mine):
        self.gathered.append(mine)
        return self.peer_hosts or [mine] * self.size


@pytest.fixture(autouse=True)
def _plain_process(monkeypatch):
    monkeypatch.delenv(RANKS_PER_NODE, raising=False)
    monkeypatch.delenv("RANK", raising=False)


def test_ranks_on_one_host_pass():
    group = _Group(0, 3)
    hosts = rank_hosts(group)
    assert hosts == [socket.gethostname()] * 3 and group.gathered == [socket.gethostname()]
    check_one_host(hosts)


def test_ranks_on_two_hosts_are_refused_with_each_hosts_ranks():
    hosts = rank_hosts(_Group(0, 6, ["a", "a", "b", "a", "b", "b"]))
    with pytest.raises(SpansHostsError) as caught:
        check_one_host(hosts)
    message = str(caught.value)
    assert "6 ranks run on 2 hosts: ranks 0-1, 3 on a; ranks 2, 4-5 on b" in message
    assert "emulated" not in message
    assert isinstance(caught.value, PydfcclError)


def test_emulated_hosts_follow_the_jobs_rank(monkeypatch):
    monkeypatch.setenv(RANKS_PER_NODE, "2")
    assert [this_host(_Group(r, 5)) for r in range(5)] == [
        "node0", "node0", "node1", "node1", "node2"]
    monkeypatch.setenv("RANK", "3")       # rank 1 of a subgroup of the job's ranks 2 and 3
    assert this_host(_Group(1, 2)) == "node1"
    with pytest.raises(SpansHostsError, match=r"5 ranks run on 3 hosts \(hosts emulated by "
                       r"PYDFCCL_RANKS_PER_NODE=2\): ranks 0-1 on node0; ranks 2-3 on node1; "
                       r"rank 4 on node2"):
        check_one_host(["node0", "node0", "node1", "node1", "node2"])


def test_emulated_hosts_as_wide_as_the_job_are_one_host(monkeypatch):
    monkeypatch.setenv(RANKS_PER_NODE, "4")
    check_one_host([this_host(_Group(r, 4)) for r in range(4)])


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_ranks_per_node_names_the_variable(monkeypatch, value):
    monkeypatch.setenv(RANKS_PER_NODE, value)
    with pytest.raises(ValueError, match=f"PYDFCCL_RANKS_PER_NODE={value!r}: expected a "
                                         f"positive number"):
        rank_hosts(_Group(0, 2))


def test_hosts_are_numbered_as_nodes_in_order_of_their_first_rank():
    from pydfccl.bootstrap.topology import node_indices

    assert node_indices(["b", "b", "a", "c", "a"]) == [0, 0, 1, 2, 1]
    assert node_indices(["h"] * 3) == [0, 0, 0]


def test_ranks_on_two_hosts_pass_under_mpi_and_are_refused_without():
    """Under MPI the network proxy joins the hosts; without it (torchrun across hosts) the
    refusal says what to do instead."""
    from pydfccl.bootstrap.topology import over_mpi

    check_one_host(["a", "b"], network=True)
    with pytest.raises(SpansHostsError, match="across hosts pydfccl needs MPI, which this job "
                       "was not started with: start it with mpiexec"):
        check_one_host(["a", "b"])
    assert not over_mpi(_Group(0, 2))


def test_pairs_by_transport():
    from pydfccl.host.world_config import pair_transports
    from pydfccl.transport.summary import describe_transports

    assert pair_transports([0, 0, 1, 1]) == {"ipc": 2, "mpi": 4}
    assert describe_transports(pair_transports([0, 0, 1, 1])) == "pairs: 2 ipc, 4 mpi"
    assert describe_transports(pair_transports([0, 1, 2])) == "pairs: 3 mpi"
    assert describe_transports(pair_transports([0])) == "pairs: none"


def test_a_ring_in_blocks_crosses_once_per_node():
    from pydfccl.bootstrap.topology import ring_crossings

    assert ring_crossings([0, 0, 1, 1]) == (2, 2)
    assert ring_crossings([0, 1, 0, 1]) == (4, 2)      # round-robin: every step
    assert ring_crossings([0, 0, 0]) == (0, 0)
    assert ring_crossings([0, 1, 2]) == (3, 3)
