"""Where ranks run: the backend chosen, the GPU a rank process takes, and the warning for a
GPU shared without MPS. The GPU logic runs here with the device calls replaced (the calls
themselves run on a GPU, in the GPU acceptance batch)."""

import logging

import pytest

from pydfccl import platform
from pydfccl.bootstrap import mpi


class _Group:
    def __init__(self, rank, placed):
        self.rank, self.size, self._placed = rank, len(placed), placed

    def allgather(self, obj):
        assert obj == self._placed[self.rank]
        return self._placed


@pytest.mark.parametrize("variable", mpi.LOCAL_RANK_VARIABLES)
def test_local_rank_comes_from_the_launcher(monkeypatch, variable):
    for name in mpi.LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert mpi.local_rank(_Group(5, [None] * 6)) == 5
    monkeypatch.setenv(variable, "2")
    assert mpi.local_rank(_Group(5, [None] * 6)) == 2


@pytest.mark.parametrize("mps, devices, warned", [
    (False, [0, 0], True),     # two ranks on GPU 0, no MPS
    (True, [0, 0], False),     # the same under MPS
    (False, [0, 1], False),    # a GPU each
])
def test_shared_gpu_without_mps_is_warned(monkeypatch, caplog, mps, devices, warned):
    chosen = []
    monkeypatch.setattr(platform, "use_device", lambda i: chosen.append(i) or devices[i])
    monkeypatch.setattr(platform, "mps_active", lambda: mps)
    placed = [(__import__("socket").gethostname(), d) for d in devices]
    with caplog.at_level(logging.WARNING, logger="pydfccl"):
        busiest = mpi.choose_gpu(_Group(0, placed), local=0)
    assert chosen == [0] and busiest == max(devices.count(d) for d in devices)
    messages = [r.getMessage() for r in caplog.records]
    assert any("share GPU 0 without the MPS daemon" in m for m in messages) == warned


def test_backend_from_the_environment(monkeypatch):
    from pydfccl.bootstrap.launch import default_backend

    monkeypatch.setenv("PYDFCCL_BACKEND", "processes")
    assert default_backend() == "processes"
    monkeypatch.setenv("PYDFCCL_BACKEND", "gpu")
    with pytest.raises(ValueError, match="PYDFCCL_BACKEND='gpu'; choose from"):
        default_backend()


@pytest.mark.parametrize("ranks_on_gpu, daemons_per_rank, nblocks", [
    (1, 1, 32),     # one rank, one communicator: the most a daemon takes
    (4, 1, 32),     # 132 multiprocessors of one 512-thread block, a quarter each: 33
    (4, 4, 8),      # four torch groups on each of four ranks: 8, 128 blocks in all
    (8, 4, 4),
])
def test_gpu_daemons_fit_on_their_gpu_together(monkeypatch, ranks_on_gpu, daemons_per_rank,
                                               nblocks):
    """Every daemon of every rank on a GPU can be resident at once: a daemon that could not
    would wait for room behind daemons that wait for it (they quit, but slowly). A torch job
    makes several groups a rank, each with its own daemon (backend.DAEMONS_PER_RANK)."""
    from pydfccl.host import world_config

    monkeypatch.setattr(world_config, "multiprocessors", lambda: 132)
    got = world_config.gpu_nblocks(ranks_on_gpu * daemons_per_rank)
    assert got == nblocks
    assert got * ranks_on_gpu * daemons_per_rank <= world_config.resident_blocks(512, 132)
