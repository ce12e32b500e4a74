"""The demo's buffers: an input set a pattern, all written when made; outputs read back and
checked a batch of iterations at a time; every collective's buffer a 256-byte aligned view;
a wrong or stale output named with its iteration and collective. (The demo itself runs them
end to end in tests/cli/test_cli.py.) The buffers here are numpy arrays: the class uses
only the idioms every buffer of ``comm.empty`` has."""

from types import SimpleNamespace

import numpy as np
import pytest

from pydfccl.cli.chaos_buffers import PERIOD, ChaosBuffers
from pydfccl.protocol.reference import buffer_elems


def _buffers(rank=1, nranks=3, kinds=("all_reduce", "all_gather", "reduce"), count=37,
             **options):
    comm = SimpleNamespace(rank=rank, nranks=nranks, empty=lambda n, dtype: np.empty(n, dtype))
    sizes = [buffer_elems(kind, count, nranks) for kind in kinds]
    return ChaosBuffers(comm, list(kinds), sizes, "int32",
                        [k % nranks for k in range(len(kinds))], **options), sizes


def _sum_of_ranks(it, k=0, nranks=3, count=37):
    """An all_reduce's right output for collective ``k`` in iteration ``it``."""
    base = (np.arange(count) + 7 * k + 3 * it) % PERIOD
    return (nranks * base + nranks * (nranks + 1) // 2).astype(np.int32)


class Writes:
    """A send allocation that counts the writes made to it."""

    def __init__(self, array):
        self.array, self.count = array, 0

    def __setitem__(self, key, value):
        self.count += 1
        self.array[key] = value


def test_views_are_aligned_disjoint_and_hold_each_ranks_inputs():
    buffers, sizes = _buffers()
    buffers.fill(it=4)
    ends = []
    for k, (send, (elems, _)) in enumerate(zip(buffers.sends(4), sizes)):
        assert send.size == elems
        offset = send.ctypes.data - buffers.send_all.ctypes.data
        assert offset % 256 == 0 and (not ends or offset >= ends[-1])
        ends.append(offset + send.nbytes)
        want = ((np.arange(elems) + 7 * k + 3 * 4) % 13 + 1 + 1).astype(np.int32)   # rank 1
        np.testing.assert_array_equal(send, want)
    for it in (5, 6):             # other patterns: other sets, still aligned
        buffers.fill(it)
        assert all((s.ctypes.data - buffers.send_all.ctypes.data) % 256 == 0
                   for s in buffers.sends(it))
        assert all((r.ctypes.data - buffers.recv_all.ctypes.data) % 256 == 0
                   for r in buffers.recvs(it))
    assert buffers.sends(4)[0].ctypes.data != buffers.sends(5)[0].ctypes.data
    assert buffers.recvs(4)[0].ctypes.data != buffers.recvs(5)[0].ctypes.data


def test_every_pattern_is_written_when_made_and_never_again():
    buffers, _ = _buffers(kinds=("all_reduce",))
    assert buffers.input_sets == PERIOD
    held = [buffers.sends(it)[0].copy() for it in range(PERIOD)]
    for it in range(PERIOD):              # rank 1's inputs, before any fill
        np.testing.assert_array_equal(held[it], (np.arange(37) + 3 * it) % 13 + 2)
    buffers.send_all = Writes(buffers.send_all)
    for it in range(2 * PERIOD):
        buffers.fill(it)
        np.testing.assert_array_equal(buffers.sends(it)[0], held[it % PERIOD])
    assert buffers.send_all.count == 0


@pytest.mark.parametrize("set_bytes", [None, 4096], ids=["all patterns", "a few sets"])
def test_outputs_are_checked_a_batch_at_a_time_and_the_wrong_one_named(set_bytes):
    """With every pattern's outputs laid out ahead, and with sets that fit only a few
    (expected outputs joined for each batch)."""
    options = {} if set_bytes is None else dict(set_bytes=set_bytes)
    buffers, _ = _buffers(kinds=("all_reduce", "all_reduce"), **options)
    assert 1 < buffers.batch < PERIOD
    for it in range(buffers.batch):
        buffers.fill(it)
        for k, recv in enumerate(buffers.recvs(it)):
            recv[...] = _sum_of_ranks(it, k)
        expected = 2 * buffers.batch if it == buffers.batch - 1 else 0
        assert buffers.check(it) == expected
    it = buffers.batch + 2
    for i in range(buffers.batch, it + 1):
        for k, recv in enumerate(buffers.recvs(i)):
            recv[...] = _sum_of_ranks(i, k)
    buffers.recvs(it - 1)[1][5] += 1
    assert buffers.check(it - 1) == 0          # within the batch: not read yet
    with pytest.raises(AssertionError, match=rf"iteration {it - 1}, collective 1 "
                                             r"\(all_reduce\): element 5 is"):
        buffers.check(it, last=True)           # the last iteration ends the batch early


def test_a_reduce_is_checked_only_at_its_root():
    nranks, count = 3, 37
    buffers, _ = _buffers(rank=1, nranks=nranks, count=count, kinds=("reduce", "reduce"))
    buffers.fill(0)                                   # roots 0 and 1: rank 1 roots the second
    buffers.recvs(0)[0][...] = -1                     # undefined: not read
    base = (np.arange(count) + 7) % 13
    buffers.recvs(0)[1][...] = (nranks * base + 6).astype(np.int32)
    assert buffers.check(0, last=True) == 1


@pytest.mark.parametrize("set_bytes", [None, 2048, 1], ids=["batched", "a few sets",
                                                         "one set"])
def test_outputs_a_collective_left_in_place_are_refused(set_bytes):
    """A collective that wrote nothing leaves the outputs of the iteration that used its
    receive set before, which had another input pattern: batched, and with one set of
    each (sets too big for device memory: inputs written every iteration)."""
    options = {} if set_bytes is None else dict(set_bytes=set_bytes)
    buffers, _ = _buffers(kinds=("all_reduce",), **options)
    if set_bytes == 1:
        assert buffers.input_sets == 1 and buffers.batch == 1
    batch = buffers.batch
    for it in range(batch):
        buffers.fill(it)
        buffers.recvs(it)[0][...] = _sum_of_ranks(it)
        buffers.check(it)
    for it in range(batch, 2 * batch):
        buffers.fill(it)
        if it != batch:                   # iteration `batch` writes nothing
            buffers.recvs(it)[0][...] = _sum_of_ranks(it)
        if it < 2 * batch - 1:
            buffers.check(it)
    with pytest.raises(AssertionError, match=f"iteration {batch}, collective 0"):
        buffers.check(2 * batch - 1)
    if set_bytes == 1:  # and the inputs are rewritten for each iteration's pattern
        buffers.fill(5)
        np.testing.assert_array_equal(buffers.sends(5)[0],
                                      (np.arange(37) + 15) % 13 + 2)
