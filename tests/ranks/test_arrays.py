"""User programs with the public API only, on rank processes (the simulator): the array
``comm.empty`` makes, results that are the user's own objects, the buffer checks, futures
that hold their buffers, and ``count=0``."""

import pydfccl
from array_workers import (array_idioms, bad_inputs, futures_hold_buffers, refused_buffers,
                           stream_ordered)


def test_arrays_fill_run_and_come_back_as_the_same_objects():
    per_rank = pydfccl.launch(array_idioms, 2, timeout=300)
    for rank, got in enumerate(per_rank):
        # x: [0, 1*(r+1), 2*(r+1), r, r, r, r, r] summed over ranks 0 and 1
        assert got["out"] == [0, 3, 6, 1, 1, 1, 1, 1]
        assert got["same"] and got["type"] == "Array"
        assert got["in_place"] == [-7, -7] + [2] * 8 + [-7, -7]    # only the view reduced
        assert got["in_place_same"] and got["gathered_same"] and got["np_same"]
        assert got["gathered"] == [0.0, 0.5, 1.0, 0.5]
        assert got["gathered_in_place"] == [0.0, 0.5, 1.0, 0.5]
        # rank r's block of (arange(4) + 0) + (arange(4) + 1); the other block untouched
        block = [1 + 2 * (2 * rank), 1 + 2 * (2 * rank + 1)]
        untouched = [v + rank for v in range(4)][2 - 2 * rank:4 - 2 * rank]
        assert got["scattered_in_place"] == (block + untouched if rank == 0
                                             else untouched + block)
        assert got["broadcast"] == [1.5] * 4
        assert got["np_out"] == [1] * 8


def test_refused_buffers_name_the_problem():
    (got,) = pydfccl.launch(refused_buffers, 1, timeout=300)
    messages = got["messages"]
    expected = [
        "ValueError: collective 0 (all_reduce): send buffer has 9 elements, the prepared "
        "count needs 8; pass x[:8] to use part of a larger buffer",
        "ValueError: collective 0 (all_reduce): send buffer has 7 elements, the prepared "
        "count needs 8",
        "ValueError: collective 0 (all_reduce): recv buffer is read-only, and the collective "
        "writes it",
        "ValueError: collective 0 (all_reduce): recv buffer is read-only, and the collective "
        "writes it",
        "ValueError: collective 0 (all_reduce): recv buffer is read-only, and the collective "
        "writes it",
        "ValueError: collective 0 (all_reduce): the send and recv buffers overlap; pass "
        "separate buffers or the same buffer (in place)",
        "ValueError: collective 1 (all_gather): the send and recv buffers overlap; pass "
        "separate buffers or NCCL's in-place form (send = recv[0:4])",
        "TypeError: coll_id must be an int, got True (bool)",
        "TypeError: collective 0: priority must be an int, got 1.5 (float)",
        "ValueError: collective 3: count 9223372036854775808 is too large: its all_reduce "
        "needs a buffer of 36893488147419103232 bytes, more than the 281474976710656 (2**48) "
        "pydfccl can address",
    ]
    assert messages == expected
    assert got["reduced"] == [1.0] * 8
    assert got["zero_done"] and got["zero_same"]


def test_a_kept_future_holds_its_buffers_without_a_warning():
    for got in pydfccl.launch(futures_hold_buffers, 2, args=(False,), timeout=300):
        assert got["results"] == [[1, 1, 1, 1], [3, 3, 3, 3], [5, 5, 5, 5], [2, 2, 2, 2]]
        assert got["dropped"] == 0 and got["warnings"] == []


def test_buffers_dropped_with_their_futures_are_reported():
    for rank, got in enumerate(pydfccl.launch(futures_hold_buffers, 2, args=(True,),
                                              timeout=300)):
        assert got["results"] == [[2, 2, 2, 2]]
        assert got["dropped"] == 3
        assert got["warnings"] == [
            f"rank {rank}: collective 0's in-place buffer was dropped by the user before the "
            "collective completed; pydfccl kept it alive until then"] * 3


def test_bad_input_raises_clear_errors():
    (messages,) = pydfccl.launch(bad_inputs, 1, timeout=120)
    text = "\n".join(messages)
    for fragment in ["only allowed after start()", "unknown collective kind 'all_to_everyone'",
                     "unknown reduction op 'xor'", "unknown dtype 'complex64'",
                     "count must be a non-negative int, got -1",
                     "count must be an int, got 10.0 (float)",
                     "coll_id must be a non-negative int", "already prepared",
                     "only allowed before start()", "unknown collective 7",
                     "has 9 elements, the prepared count needs 10",
                     "has dtype int32, expected float32", "not C-contiguous",
                     "this communicator is closed",
                     "collective 1 (reduce_scatter) needs a recv buffer",
                     "collective 1 (reduce_scatter): send buffer has 4 elements, the prepared "
                     "count needs 5",
                     "expected a numpy array, a Numba device array or a pydfccl array "
                     "(comm.empty) under the simulator, got list"]:
        assert fragment in text, fragment


def test_runs_ordered_on_the_users_stream():
    """``run(..., stream=)`` on the simulator: the same program as on a GPU
    (tests/gpu/test_arrays_gpu.py), with a simulated stream."""
    for got in pydfccl.launch(stream_ordered, 2, args=(10,), timeout=300):
        assert got["summed_ok"] and got["same"] and got["doubled_ok"] and got["again_ok"]
        assert got["ordered"] == [[3.0, 5.0, 7.0, 9.0], [300.0] * 4]
        assert "stream must be a CUDA stream" in got["refused"]
        assert "got str" in got["refused"]
