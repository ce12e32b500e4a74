"""How many channels (daemon blocks) a collective spreads over, by its size and the world's."""

from pydfccl.kernels.ring import MIN_CHANNEL_CHUNK, channel_count

MiB = 1 << 20


def test_a_small_collective_takes_one_channel():
    assert channel_count(True, 2, 4, 2, nblocks=4, slot_bytes=128 * 1024) == 1
    assert channel_count(False, 1, 8, 8, nblocks=32, slot_bytes=512 * 1024) == 1


def test_large_slots_no_longer_leave_blocks_idle_at_middle_sizes():
    # 16 MiB of float32 on 4 ranks, 32 blocks of 512 KiB slots: a loop holds 2 MiB, so
    # counting whole loops gave 8 channels; chunks of MIN_CHANNEL_CHUNK give all 32
    count = 16 * MiB // 4
    assert channel_count(True, count, 4, 4, nblocks=32, slot_bytes=512 * 1024) == 32


def test_the_channel_count_is_capped_by_the_blocks():
    assert channel_count(True, 1 << 30, 4, 4, nblocks=4, slot_bytes=128 * 1024) == 4


def test_slots_below_the_minimum_count_whole_loops_as_before():
    # the simulator's 256-byte slots and the tests' small ones: a channel per loop
    for nranks, nblocks, slot_bytes, itemsize in ((2, 3, 64, 2), (3, 2, 128, 4), (4, 1, 256, 8)):
        for count in (1, 5, 64, 100, 257, 700):
            for all_reduce in (True, False):
                loop = slot_bytes // itemsize * (nranks if all_reduce else 1)
                assert channel_count(all_reduce, count, itemsize, nranks, nblocks,
                                     slot_bytes) == max(1, min(nblocks, -(-count // loop)))


def test_other_kinds_take_a_channel_per_chunk_of_the_minimum():
    # an all_gather's count is per rank; its steps move a chunk of it at a time
    count = 5 * MIN_CHANNEL_CHUNK // 4 + 1
    assert channel_count(False, count, 4, 8, nblocks=16, slot_bytes=1 * MiB) == 6
