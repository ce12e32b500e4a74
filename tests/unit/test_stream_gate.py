"""The stream gate (``host.stream_gate``) with stand-in stream operations, and the stream
handles ``run(..., stream=)`` accepts."""

import threading
import time
from concurrent.futures import Future

import numpy as np
import pytest

from pydfccl import platform
from pydfccl.host.stream_gate import StreamGate
from pydfccl.platform.streams import StreamWriteOps
from waiting import wait_until


class FakeStreamOps:
    """Streams whose queued work finishes when ``flush`` says so; a write lands then. It
    has no wait operation: nothing pydfccl does may make a stream wait for a run."""

    def __init__(self):
        self.hold = False
        self.pending = []

    def mapped_words(self, n):
        self.host = np.zeros(n, np.int64)
        return self.host, self.host.ctypes.data

    def write(self, stream, addr, value):
        self.pending.append((stream, addr, value))
        if not self.hold:
            self.flush()

    def flush(self, stream=None):
        """Let ``stream``'s queued work (every stream's if None) finish."""
        kept = []
        for s, addr, value in self.pending:
            if stream is None or s == stream:
                self.host[(addr - self.host.ctypes.data) // 8] = value
            else:
                kept.append((s, addr, value))
        self.pending = kept


def submit_into(log, name):
    return lambda: log.append(name)


def test_a_run_starts_once_its_stream_reaches_the_gate():
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=4)
    ops.hold = True                       # the stream has not reached the gate yet
    started = []
    gate.gate(7, submit_into(started, "a"), None, key="k")
    time.sleep(0.05)
    assert started == [] and gate.waiting("k")
    ops.flush()                           # the stream passes: the watcher submits
    assert wait_until(lambda: started == ["a"])
    assert wait_until(lambda: not gate.waiting("k"))


def test_a_run_counts_as_waiting_until_it_has_been_submitted():
    """The watcher has taken a run whose stream reached the gate but not yet submitted it:
    a later run of its collective must still queue behind it, not overtake it."""
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=4)
    entered, release = threading.Event(), threading.Event()

    def slow_start():
        entered.set()
        release.wait(5)

    gate.gate(7, slow_start, None, key="k")
    assert entered.wait(5)
    assert gate.waiting("k")
    release.set()
    assert wait_until(lambda: not gate.waiting("k"))
    assert "k" not in gate._keys            # no key (and its communicator) kept once idle


def test_runs_of_one_collective_start_in_submission_order():
    """A later run of the same key waits behind an earlier one whose stream is slower,
    whether it has a stream or not; another key's run does not wait."""
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=8)
    ops.hold = True
    started = []
    gate.gate(1, submit_into(started, "A1 (slow stream)"), None, key="A")
    gate.gate(2, submit_into(started, "A2"), None, key="A")
    gate.gate(None, submit_into(started, "A3 (no stream)"), None, key="A")
    gate.gate(2, submit_into(started, "B1"), None, key="B")
    ops.flush(stream=2)
    assert wait_until(lambda: started == ["B1"])
    time.sleep(0.05)
    assert started == ["B1"]
    ops.flush(stream=1)
    assert wait_until(lambda: len(started) == 4)
    assert started == ["B1", "A1 (slow stream)", "A2", "A3 (no stream)"]


def test_a_failed_submission_fails_its_run_and_nothing_waits_on_the_gpu():
    """A submission that raises goes to the run's future; no stream was told to wait for
    it (the driver operations have no wait), so no kernel can go on as if it succeeded."""
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=4)
    future = Future()

    def fails():
        raise RuntimeError("rank 1: aborted")

    gate.gate(7, fails, future.set_exception, key="k")
    with pytest.raises(RuntimeError, match="aborted"):
        future.result(timeout=5)
    assert [m for m in dir(StreamWriteOps) if "wait" in m.lower()] == []


def test_a_slot_is_not_reused_before_its_stream_reaches_it():
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=3)
    ops.hold = True
    for key in "abc":
        gate.gate(0, Future, None, key=key)
    with pytest.raises(RuntimeError, match="3 stream-ordered runs since the oldest one whose "
                                           "stream has not reached it"):
        gate.gate(0, Future, None, key="d")
    ops.flush()                            # once it has, the gate takes more
    assert wait_until(lambda: not gate.waiting("a"))
    gate.gate(0, Future, None, key="d")


def test_gated_runs_started_from_many_threads_all_start_once():
    ops = FakeStreamOps()
    gate = StreamGate(ops, nwords=256)
    started, lock = [], threading.Lock()

    def submitter(t):
        for i in range(50):
            def start(t=t, i=i):
                with lock:
                    started.append((t, i))
            gate.gate(t if i % 2 else None, start, None, key=(t, i % 3))

    threads = [threading.Thread(target=submitter, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wait_until(lambda: len(started) == 200)
    assert sorted(started) == [(t, i) for t in range(4) for i in range(50)]
    for t in range(4):      # each key's runs in the order they were gated
        for k in range(3):
            mine = [i for (tt, i) in started if tt == t and i % 3 == k]
            assert mine == sorted(mine)


class CudaStreamProtocol:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class OldTorchStream:
    cuda_stream = 0x5000


class OldCupyStream:
    ptr = 0x6000


@pytest.mark.parametrize("stream, handle", [
    (0, 0), (0x1234, 0x1234), (np.int64(5), 5), (CudaStreamProtocol(0x7000), 0x7000),
    (OldTorchStream(), 0x5000), (OldCupyStream(), 0x6000)])
def test_stream_handles_from_every_kind_of_stream(stream, handle):
    assert platform.stream_handle(stream) == handle


@pytest.mark.parametrize("stream, error, match", [
    ("default", TypeError, "stream must be a CUDA stream .* got str"),
    (True, TypeError, "got bool"),
    (1.0, TypeError, "got float"),
    (-1, ValueError, "stream must be a stream handle, got -1")])
def test_what_is_not_a_stream_is_refused_by_name(stream, error, match):
    with pytest.raises(error, match=match):
        platform.stream_handle(stream)
