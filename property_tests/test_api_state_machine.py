"""The host API of one rank as a state machine: prepare, start, run, wait, sync, close.

The simulator runs only in rank processes, so the whole Hypothesis run happens inside one:
``pydfccl.launch(api_state_machine_worker, 1)`` calls ``run_state_machine_as_test`` there,
and every example builds a fresh single-rank communicator on a world of its own (a
one-rank all-reduce is a copy, so every result is known). A failing example's steps come
back in the RankFailedError, with Hypothesis' notes.

Rules cover valid and invalid ``prepare`` arguments, ``start``, ``run`` with good buffers,
the wrong dtype, too few elements, a non-array, an unknown id and a non-integer priority,
waiting on futures, device syncs, ``close`` and use after close. Every call either succeeds
where the state allows it or raises the documented error (``PydfcclError`` for the wrong state,
``ValueError``/``TypeError`` for bad arguments); every wait is bounded, so a hang fails.
The invariant: ``stats()["completed"]`` equals the number of futures seen done with a result
(and, once all are done, ``stats()["submitted"]`` the number of runs accepted).
"""

import os
import time

import numpy as np
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

import pydfccl
from pydfccl import AbortedError, PydfcclError
from pydfccl.host.world import World
from pydfccl.host.world_config import WorldConfig

EXAMPLES = 2000 if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else 200
STEPS = 15
WAIT_S = 30.0          # no single wait may take longer: a hang fails the example
CLOSE_AFTER = 6        # steps before close() may be chosen (it ends the interesting part)
SETTLE_S = 10.0        # how long completions may take to show up as done futures
DTYPES = ["float32", "int64", "int32", "float64"]
OPS = ["sum", "prod", "max", "min", "avg"]

BAD_PREPARE = {   # what -> (prepare kwargs, the errors it may raise)
    "kind": (dict(kind="all_to_everyone"), ValueError),
    "op": (dict(op="xor"), ValueError),
    "dtype_name": (dict(dtype="complex64"), ValueError),
    "dtype_object": (dict(dtype=3.5), (TypeError, ValueError)),
    "count_negative": (dict(count=-1), ValueError),
    "count_float": (dict(count=2.5), TypeError),
    "count_bool": (dict(count=True), TypeError),
    "count_huge": (dict(count=2 ** 63), ValueError),
    "root": (dict(root=1), ValueError),
    "coll_id_negative": (dict(coll_id=-1), ValueError),
    "coll_id_str": (dict(coll_id="a"), TypeError),
}


def expect(errors, fn, *args, **kwargs):
    """Call ``fn``; it must raise one of ``errors`` (and nothing else)."""
    try:
        fn(*args, **kwargs)
    except errors as exc:
        note(f"  raised {type(exc).__name__}: {exc}")
        return exc
    raise AssertionError(f"{getattr(fn, '__name__', fn)}{args} did not raise {errors}")


class HostAPI(RuleBasedStateMachine):
    """One rank's communicator against a model of its state and of every run's result."""

    seen = {}   # rule outcome -> count, over all examples (returned to the test)

    def __init__(self):
        super().__init__()
        self.comm = pydfccl.Communicator(World(WorldConfig(1)), 0)
        self.state = "preparing"
        self.specs = {}        # coll_id -> (count, dtype)
        self.runs = []         # (future, expected, recv, send): buffers stay alive to the end
        self.max_colls = self.comm.world.config.max_colls
        self.steps = self.closes = 0

    def tally(self, what):
        self.steps += 1
        HostAPI.seen[what] = HostAPI.seen.get(what, 0) + 1

    # -- registration --------------------------------------------------------------------

    @precondition(lambda self: self.state == "preparing")
    @rule(coll_id=st.integers(0, 20), count=st.integers(1, 40), dtype=st.sampled_from(DTYPES),
          op=st.sampled_from(OPS), priority=st.integers(-2, 3))
    def prepare(self, coll_id, count, dtype, op, priority):
        args = dict(coll_id=coll_id, kind="all_reduce", count=count, dtype=dtype, op=op,
                    priority=priority)
        if coll_id in self.specs or len(self.specs) >= self.max_colls:
            expect(ValueError, self.comm.prepare, **args)
            self.tally("prepare: duplicate or full")
        else:
            self.comm.prepare(**args)
            self.specs[coll_id] = (count, dtype)
            self.tally("prepare: ok")

    @precondition(lambda self: self.state == "preparing")
    @rule(what=st.sampled_from(sorted(BAD_PREPARE)))
    def prepare_bad_arguments(self, what):
        over, errors = BAD_PREPARE[what]
        args = dict(dict(coll_id=99, kind="all_reduce", count=4, dtype="float32"), **over)
        expect(errors, self.comm.prepare, **args)
        self.tally(f"prepare: bad {what}")

    @precondition(lambda self: self.state == "preparing" and (self.specs or self.steps >= 8))
    @rule()
    def start(self):
        self.comm.start()
        self.state = "started"
        self.tally("start: ok")

    # -- running -------------------------------------------------------------------------

    def buffers(self, count, dtype, seed=0):
        send = self.comm.empty(count, dtype)
        send[...] = (np.arange(count) * 3 + seed) % 17
        recv = self.comm.empty(count, dtype)
        recv[...] = -1
        return send, recv

    @precondition(lambda self: self.state == "started" and self.specs)
    @rule(data=st.data(), in_place=st.booleans(), priority=st.none() | st.integers(-1, 2),
          seed=st.integers(0, 100))
    def run(self, data, in_place, priority, seed):
        coll_id = data.draw(st.sampled_from(sorted(self.specs)), label="coll_id")
        send, recv = self.buffers(*self.specs[coll_id], seed)
        future = self.comm.run(coll_id, send, None if in_place else recv, priority=priority)
        self.runs.append((future, np.asarray(send), send if in_place else recv, send))
        self.tally("run: submitted")

    @precondition(lambda self: self.state == "started")
    @rule(what=st.sampled_from(["dtype", "recv_dtype", "too_small", "recv_too_small",
                                "not_an_array", "unknown_id", "priority"]), data=st.data())
    def run_bad_arguments(self, what, data):
        if not self.specs:
            what = "unknown_id"
        errors = ValueError
        if what == "unknown_id":
            coll_id = max(self.specs, default=0) + 1
            send, recv = self.buffers(4, "float32")
        else:
            coll_id = data.draw(st.sampled_from(sorted(self.specs)), label="coll_id")
            count, dtype = self.specs[coll_id]
            send, recv = self.buffers(count, dtype)
            other = "int32" if dtype != "int32" else "float32"
            if what == "dtype":
                send, errors = self.comm.empty(count, other), TypeError
            elif what == "recv_dtype":
                recv, errors = self.comm.empty(count, other), TypeError
            elif what == "too_small":
                send = send[: count - 1]
            elif what == "recv_too_small":
                recv = recv[: count - 1]
            elif what == "not_an_array":
                send, errors = np.asarray(send).tolist(), TypeError
        priority = "high" if what == "priority" else None
        if what == "priority":
            errors = (TypeError, ValueError)
        expect(errors, self.comm.run, coll_id, send, recv, priority=priority)
        self.tally(f"run: bad {what}")

    @precondition(lambda self: self.state == "started")
    @rule()
    def synchronize_device(self):
        begun = time.monotonic()
        self.comm.synchronize_device()
        assert time.monotonic() - begun < WAIT_S
        self.tally("sync: ok")

    @rule(call=st.sampled_from(["prepare", "start", "run", "synchronize_device"]))
    def call_in_the_wrong_state(self, call):
        """Each call is allowed in its states only (prepare also after start: late
        registration); elsewhere it raises PydfcclError."""
        allowed = {"prepare": ("preparing", "started"), "start": ("preparing",)}.get(
            call, ("started",))
        if self.state in allowed:
            return
        coll_id = min(self.specs, default=0)
        args = dict(prepare=(coll_id + 50, "all_reduce", 4),
                    run=(coll_id, *self.buffers(*self.specs.get(coll_id, (4, "float32")))))
        expect(PydfcclError, getattr(self.comm, call), *args.get(call, ()))
        self.tally(f"{call}: wrong state ({self.state})")

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def wait_one(self, data):
        future, want, recv, _ = data.draw(st.sampled_from(self.runs), label="run")
        self.check_result(future, want, recv)

    @precondition(lambda self: self.runs)
    @rule()
    def wait_all(self):
        for future, want, recv, _ in self.runs:
            self.check_result(future, want, recv)

    def check_result(self, future, want, recv):
        try:
            out = future.result(timeout=WAIT_S)
        except AbortedError:
            assert self.state == "closed", "a run failed while the communicator was open"
            self.tally("wait: aborted by close")
            return
        assert out is recv
        assert np.array_equal(out, want), (out, want)
        self.tally("wait: exact result")

    @precondition(lambda self: self.steps >= CLOSE_AFTER and self.closes < 2)
    @rule()
    def close(self):
        begun = time.monotonic()
        self.comm.close()
        assert time.monotonic() - begun < WAIT_S
        self.tally("close: again" if self.state == "closed" else f"close: {self.state}")
        self.closes += 1
        self.state = "closed"
        # nothing is left waiting: every run either completed or failed with AbortedError
        for future, *_ in self.runs:
            assert future.done()
            exc = future.exception(timeout=0)
            assert exc is None or isinstance(exc, AbortedError), repr(exc)

    # -- the invariant -------------------------------------------------------------------

    @invariant()
    def completed_counts_the_futures_done(self):
        """Futures complete just after the count moves (set_result follows the CQ drain),
        so wait, bounded, until both agree; with finite work they must."""
        deadline = time.monotonic() + SETTLE_S
        while True:
            stats = self.comm.stats()
            done = sum(1 for f, *_ in self.runs
                       if f.done() and not f.cancelled() and f.exception(timeout=0) is None)
            if stats["completed"] == done:
                break
            assert time.monotonic() < deadline, (
                f"stats()['completed'] is {stats['completed']} but {done} futures are done")
            time.sleep(0.001)
        assert stats["completed"] <= stats["submitted"] <= len(self.runs)
        if self.state == "started" and done == len(self.runs):
            assert stats["submitted"] == len(self.runs), "a refused run was submitted"

    def teardown(self):
        self.comm.close()
        assert all(f.done() for f, *_ in self.runs)


def api_state_machine_worker(comm, max_examples: int, steps: int) -> dict:
    """Runs in the rank process (the simulator); ``comm`` itself is not used."""
    HostAPI.seen = {}
    began = time.monotonic()
    run_state_machine_as_test(HostAPI, settings=settings(
        max_examples=max_examples, stateful_step_count=steps, deadline=None,
        print_blob=True, suppress_health_check=list(HealthCheck)))
    return dict(seen=dict(HostAPI.seen), seconds=time.monotonic() - began)


def test_host_api_state_machine():
    (summary,) = pydfccl.launch(api_state_machine_worker, 1, args=(EXAMPLES, STEPS), timeout=240)
    seen = summary["seen"]
    print(f"{summary['seconds']:.1f} s:", seen)
    for what in ["prepare: ok", "start: ok", "run: submitted", "wait: exact result"]:
        assert seen.get(what, 0) > 0, (what, seen)
    assert any(k.startswith("run: bad") for k in seen), seen
    assert any(k.startswith("run: wrong state") for k in seen), seen
    assert any(k.endswith("(closed)") for k in seen), seen
