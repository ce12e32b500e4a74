"""The fixed-layout records shared by host and kernel."""

import numpy as np
import pytest

from pydfccl.protocol import layout as L
from pydfccl.host.world_config import WorldConfig


def test_record_sizes_are_fixed_and_aligned():
    assert L.SQ_ENTRY.itemsize == 64
    assert L.CQ_ENTRY.itemsize == 16
    assert L.BLOCK_STATUS.itemsize == 64
    assert L.COLL_ENTRY.itemsize == 64
    assert L.TASK.itemsize == 128
    assert L.CTL_ROW.itemsize % 64 == 0
    assert L.HEADER_BYTES % 256 == 0 and L.HEADER_BYTES >= L.POOL_HEADER.itemsize


def test_queues_cannot_overflow_with_every_collective_at_its_runs_in_flight():
    assert L.SQ_CAP >= L.MAX_COLLS * L.RUNS_IN_FLIGHT
    assert L.CQ_CAP >= L.MAX_COLLS * L.RUNS_IN_FLIGHT
    assert L.POOL_HEADER["queue"].shape == (L.MAX_BLOCKS, L.MAX_COLLS, L.RUNS_IN_FLIGHT - 1)


def test_offsets_come_from_the_dtypes():
    row = np.zeros(1, L.CTL_ROW)
    raw = row.view(np.int64)
    row["sq"]["seq"][0, 3] = 42
    assert raw[(L.CTL_SQ + 3 * L.SQ_SIZE + L.SQ_F["seq"]) // 8] == 42
    row["blocks"]["progress"][0, 2] = 7
    assert raw[(L.CTL_BLOCKS + 2 * L.BS_SIZE + L.BS["progress"]) // 8] == 7


def test_connectors_do_not_overlap():
    cfg = WorldConfig(4, nblocks=2, nslots=3, slot_bytes=256, max_colls=5, simulator=True)
    assert cfg.conn_stride == L.CONN_HEADER_BYTES + 3 * 256
    assert cfg.pool_bytes == L.HEADER_BYTES + 5 * 2 * cfg.conn_stride
    assert L.CONN_HEAD - L.CONN_TAIL >= 64


@pytest.mark.parametrize("bad", [dict(nslots=1), dict(nblocks=0), dict(slot_bytes=100),
                                 dict(max_colls=L.MAX_COLLS + 1), dict(nblocks=L.MAX_BLOCKS + 1)])
def test_world_config_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="WorldConfig"):
        WorldConfig(2, simulator=True, **bad)


def test_gpu_worlds_take_32_channels_or_their_share_of_a_shared_gpu(monkeypatch):
    """Every rank's daemon blocks must fit on the GPU at once (a block of 256 threads or more
    fills a multiprocessor's registers): 32 channels a rank while they do, else the largest
    power of two that does; a size given is kept. The simulator's default stays one block."""
    from pydfccl.host import world_config

    monkeypatch.setattr(world_config, "multiprocessors", lambda: 132)    # an H200
    assert [world_config.gpu_nblocks(n) for n in (1, 2, 4, 5, 8, 16, 132, 200)] == \
        [32, 32, 32, 16, 16, 8, 1, 1]
    assert WorldConfig(8, simulator=False).nblocks == 16
    assert WorldConfig(8, simulator=False, nthreads=128).nblocks == 32   # two a multiprocessor
    assert WorldConfig(8, simulator=False, nblocks=3).nblocks == 3
    assert WorldConfig(8, simulator=True).nblocks == 1
    monkeypatch.setattr(world_config, "multiprocessors", lambda: 78)     # a smaller GPU
    assert world_config.gpu_nblocks(4) == 16
    monkeypatch.setattr(world_config, "multiprocessors", lambda: None)   # no GPU: an H200
    assert world_config.gpu_nblocks(4) == 32


def test_a_world_whose_daemons_cannot_all_be_resident_is_warned_of(monkeypatch, caplog):
    from pydfccl.host import world

    monkeypatch.setattr(world, "multiprocessors", lambda: 132)
    with caplog.at_level("WARNING", logger="pydfccl"):
        world._warn_if_daemons_overflow(WorldConfig(4, nblocks=32, simulator=False))
        assert not caplog.records
        world._warn_if_daemons_overflow(WorldConfig(8, nblocks=32, nthreads=128,
                                                    simulator=False))   # 2 a multiprocessor
        assert not caplog.records
        world._warn_if_daemons_overflow(WorldConfig(8, nblocks=32, simulator=False))
    [record] = caplog.records
    assert "8 ranks x 32 daemon blocks = 256 blocks, but this GPU holds 132 at once " \
           "(132 multiprocessors x 1)" in record.message


@pytest.mark.parametrize("loop", [0, 1, 7, 123_456])
def test_a_step_word_gives_back_its_loop_and_step(loop):
    for step in (0, 1, 2 * 256 - 2, L.STEP_WORD_STEPS - 1):
        word = L.pack_step(loop, step)
        assert L.unpack_step(word) == (loop, step)
    assert L.pack_step(loop, L.STEP_WORD_STEPS - 1) < L.pack_step(loop + 1, 0)   # ordered


def test_the_daemon_packs_step_words_with_the_hosts_function():
    from pydfccl.kernels import daemon

    assert daemon.step_word.py_func is L.pack_step
