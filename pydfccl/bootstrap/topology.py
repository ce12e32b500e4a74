"""Which host (node) each rank of a job runs on, and the refusal of a job that spans hosts
without MPI.

The ranks of a node share memory: the node's control rows are a shared-memory segment, and
its pools are shared memory (simulator) or device memory opened through CUDA IPC handles
(GPUs). Neither reaches another host: there a rank's connectors go through the network
proxy (``pydfccl.transport``), which moves them with MPI. A job whose ranks span hosts is
therefore allowed when MPI started it (``from_mpi``) and refused on every rank otherwise
(torchrun across hosts, ``from_env``), before anything is shared, with each rank's host
named.

``PYDFCCL_RANKS_PER_NODE=K`` emulates hosts on one machine: the processes of ranks r and s
of the job are on the same host when ``r // K == s // K``, so that whatever crosses hosts
(the proxy, the refusal) can be tried without a second machine.
"""

from __future__ import annotations

import os
import socket

from ..errors import SpansHostsError

__all__ = ["RANKS_PER_NODE", "ranks_per_node", "this_host", "rank_hosts", "check_one_host",
           "node_indices", "over_mpi", "ring_crossings"]

RANKS_PER_NODE = "PYDFCCL_RANKS_PER_NODE"


def ranks_per_node() -> int | None:
    """``PYDFCCL_RANKS_PER_NODE`` as a positive int, or None when it is unset or empty."""
    text = os.environ.get(RANKS_PER_NODE, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{RANKS_PER_NODE}={text!r}: expected a positive number of ranks "
                         f"a host")
    return value


def _job_rank(group) -> int:
    """This process's rank in the whole job (a torch subgroup's or an MPI
    sub-communicator's rank is not): ``RANK`` as launchers set it, else MPI's world rank,
    else the group's."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    if hasattr(group, "Split_type"):
        from mpi4py import MPI

        return MPI.COMM_WORLD.rank
    return group.rank


def this_host(group) -> str:
    """This rank's host as its peers will compare it. Emulated hosts
    (``PYDFCCL_RANKS_PER_NODE``) are ``node0``, ``node1``, ... by the job's rank. Under MPI,
    ranks that MPI puts in one shared-memory communicator (``Split_type(COMM_TYPE_SHARED)``)
    are one host, named by the hostname of its lowest rank; otherwise the hostname."""
    per_node = ranks_per_node()
    if per_node is not None:
        return f"node{_job_rank(group) // per_node}"
    split = getattr(group, "Split_type", None)
    if split is None:
        return socket.gethostname()
    from mpi4py import MPI

    local = split(MPI.COMM_TYPE_SHARED)
    try:
        return local.bcast(socket.gethostname(), root=0)
    finally:
        local.Free()


def rank_hosts(group) -> list[str]:
    """The host of every rank of ``group``, in rank order, the same list on every rank."""
    return list(group.allgather(this_host(group)))


def _spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    parts, start = [], ranks[0]
    for prev, cur in zip(ranks, ranks[1:] + [None]):
        if cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(parts)


def node_indices(hosts: list[str]) -> list[int]:
    """Each rank's node as a number, the hosts numbered in the order their first rank
    comes: ``["b", "b", "a"]`` gives ``[0, 0, 1]``."""
    numbers: dict[str, int] = {}
    return [numbers.setdefault(host, len(numbers)) for host in hosts]


def ring_crossings(nodes: list[int]) -> tuple[int, int]:
    """(times the ring r -> r + 1 crosses from one node to another, the fewest any order
    of these ranks could): the rings follow the ranks, so ranks placed on nodes in blocks
    cross once per node, and ranks placed round-robin at every step."""
    n = len(nodes)
    crossings = sum(nodes[r] != nodes[(r + 1) % n] for r in range(n))
    distinct = len(set(nodes))
    return crossings, (distinct if distinct > 1 else 0)


def over_mpi(group) -> bool:
    """Whether ``group`` is an MPI communicator, which the network proxy can use."""
    return hasattr(group, "Split_type")


def check_one_host(hosts: list[str], network: bool = False) -> None:
    """Raise ``SpansHostsError`` unless every rank is on one host or ``network`` (the job
    is under MPI, which joins the hosts); the message names the ranks on each host."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    if len(by_host) <= 1 or network:
        return
    where = "; ".join(f"{'rank' if len(ranks) == 1 else 'ranks'} {_spans(ranks)} on {host}"
                      for host, ranks in by_host.items())
    emulated = (f" (hosts emulated by {RANKS_PER_NODE}={os.environ[RANKS_PER_NODE]})"
                if ranks_per_node() is not None else "")
    raise SpansHostsError(
        f"this job's {len(hosts)} ranks run on {len(by_host)} hosts{emulated}: {where}. The "
        f"ranks of one host share memory; across hosts pydfccl needs MPI, which this job "
        f"was not started with: start it with mpiexec and make the communicator with "
        f"Communicator.from_mpi, or make a communicator (or a torch process group) of each "
        f"host's ranks")
