"""How ``launch`` starts rank processes (``bootstrap.start_method``): under the simulator a
fork of a server that has imported Numba and pydfccl, which must still give every rank
the launcher's environment of the moment."""

import os

import pydfccl
from pydfccl import platform


def _environment_of_a_rank(comm, name):
    return os.environ.get(name), os.getppid()


def test_ranks_see_the_launchers_environment_of_the_moment(monkeypatch):
    """A server started with another environment is replaced, so that ranks see the
    variables as they are when launch() is called (pydfccl reads some when its modules
    are imported), as spawned ranks do."""
    monkeypatch.setenv("PYDFCCL_TEST_MARK", "first")
    first = pydfccl.launch(_environment_of_a_rank, 2, args=("PYDFCCL_TEST_MARK",))
    again = pydfccl.launch(_environment_of_a_rank, 2, args=("PYDFCCL_TEST_MARK",))
    monkeypatch.setenv("PYDFCCL_TEST_MARK", "second")
    second = pydfccl.launch(_environment_of_a_rank, 2, args=("PYDFCCL_TEST_MARK",))
    assert [v for v, _ in first + again] == ["first"] * 4
    assert [v for v, _ in second] == ["second"] * 2
    if platform.backend.rank_start_method == "forkserver":
        servers = {p for _, p in first + again + second}
        assert os.getpid() not in servers            # forked from a server, not from here
        assert len({p for _, p in first + again}) == 1   # one server while nothing changed
        assert len(servers) == 2                      # and a new one for the new variables

