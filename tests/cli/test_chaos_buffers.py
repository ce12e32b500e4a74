"""The demo's bulk buffers: every collective's buffer a 256-byte aligned view of one
allocation, the inputs the demo has always used, and a check that finds a wrong element and
names it. (The demo itself runs them end to end in tests/cli/test_cli.py.) The buffers here
are numpy arrays: the class uses only the idioms every buffer of ``comm.empty`` has."""

from types import SimpleNamespace

import numpy as np
import pytest

from pydfccl.cli.chaos_buffers import ChaosBuffers
from pydfccl.protocol.reference import buffer_elems


def _buffers(rank=1, nranks=3, kinds=("all_reduce", "all_gather", "reduce"), count=37):
    comm = SimpleNamespace(rank=rank, nranks=nranks, empty=lambda n, dtype: np.empty(n, dtype))
    sizes = [buffer_elems(kind, count, nranks) for kind in kinds]
    return ChaosBuffers(comm, list(kinds), sizes, "int32", [k % nranks for k in
                                                             range(len(kinds))]), sizes


def _fill(buffer, values):
    buffer[...] = values


def test_views_are_aligned_disjoint_and_hold_each_ranks_inputs():
    buffers, sizes = _buffers()
    buffers.fill(it=4)
    ends = []
    for k, (send, (elems, _)) in enumerate(zip(buffers.sends, sizes)):
        assert send.size == elems
        offset = send.ctypes.data - buffers.send_all.ctypes.data
        assert offset % 256 == 0 and (not ends or offset >= ends[-1])
        ends.append(offset + send.nbytes)
        want = ((np.arange(elems) + 7 * k + 3 * 4) % 13 + 1 + 1).astype(np.int32)   # rank 1
        np.testing.assert_array_equal(send, want)


def test_the_check_passes_right_outputs_and_names_the_first_wrong_one():
    nranks, count, it = 3, 37, 2
    buffers, _ = _buffers(nranks=nranks, count=count, kinds=("all_reduce", "all_reduce"))
    buffers.fill(it)
    for k, recv in enumerate(buffers.recvs):
        base = (np.arange(count) + 7 * k + 3 * it) % 13
        _fill(recv, (nranks * base + nranks * (nranks + 1) // 2).astype(np.int32))
    assert buffers.check(it) == 2
    wrong = buffers.recvs[1].copy()
    wrong[5] += 1
    _fill(buffers.recvs[1], wrong)
    with pytest.raises(AssertionError, match=r"iteration 2, collective 1 \(all_reduce\): "
                                             r"element 5 is"):
        buffers.check(it)


def test_a_reduce_is_checked_only_at_its_root():
    nranks, count = 3, 37
    buffers, _ = _buffers(rank=1, nranks=nranks, count=count, kinds=("reduce", "reduce"))
    buffers.fill(0)                                   # roots 0 and 1: rank 1 roots the second
    _fill(buffers.recvs[0], np.full(count, -1, np.int32))   # undefined: not read
    base = (np.arange(count) + 7) % 13
    _fill(buffers.recvs[1], (nranks * base + 6).astype(np.int32))
    assert buffers.check(0) == 1


def test_inputs_and_expected_outputs_made_once_a_phase_still_catch_stale_results():
    """The inputs repeat every 13 iterations, and each phase's are made once: iteration 15
    fills what iteration 2 did, and iteration 3's check refuses iteration 2's outputs
    left in place (a collective that wrote nothing)."""
    nranks, count = 3, 37
    buffers, _ = _buffers(nranks=nranks, count=count, kinds=("all_reduce",))

    def right(it):
        base = (np.arange(count) + 3 * it) % 13
        _fill(buffers.recvs[0], (nranks * base + nranks * (nranks + 1) // 2).astype(np.int32))

    buffers.fill(2)
    first = buffers.sends[0].copy()
    right(2)
    assert buffers.check(2) == 1
    buffers.fill(3)
    with pytest.raises(AssertionError, match="iteration 3, collective 0"):
        buffers.check(3)                   # iteration 2's outputs: stale
    right(3)
    assert buffers.check(3) == 1
    buffers.fill(15)
    np.testing.assert_array_equal(buffers.sends[0], first)
    right(15)
    assert buffers.check(15) == 1
