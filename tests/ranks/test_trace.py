"""The daemons' event logs: every collective is absorbed, loaded, (preempted, loaded again)*,
completed, on every rank and block of its channels (a channel without data absorbs and
completes it at once; a block beyond them logs nothing of it); the Chrome trace is well
formed."""

import json

import numpy as np

import pydfccl
import rank_workers
import shared_workers
from pydfccl.protocol.one_shot import one_shot
from pydfccl.kernels.ring import channel_count
from pydfccl.host.trace import to_chrome
from pydfccl.host.world_config import machine_sizes


def _runs(events):
    """Per (rank, block, coll): the event names in order."""
    runs = {}
    for e in sorted(events, key=lambda e: (e["rank"], e["block"], e["t_ns"])):
        if e["coll"] is not None:
            runs.setdefault((e["rank"], e["block"], e["coll"]), []).append(e["event"])
    return runs


def test_trace_shows_every_collective_loaded_preempted_resumed_completed():
    paper_order = pydfccl.get_policy("dfccl").with_params(ORDER_BY_ID=0)
    per_rank = pydfccl.launch(rank_workers.traced_opposite_orders, 2, args=(3, 500),
                              policy=paper_order, timeout=300)
    events = [e for out in per_rank for e in out["trace"]]
    assert all(out["lost"] == 0 for out in per_rank)
    runs = _runs(events)
    assert sorted({(r, c) for r, _, c in runs}) == [(r, c) for r in range(2) for c in range(3)]
    # 500 elements make one channel: a rank's other blocks (a GPU's) leave the runs alone
    assert {block for _, block, _ in runs} == {0}
    preempted = 0
    for (rank, block, coll), names in runs.items():
        key = (rank, block, coll)
        assert names[0] == "absorbed" and names[-1] == "completed", (key, names)
        body = names[1:-1]
        assert body and body[0] == "loaded", (key, names)
        for a, b in zip(body, body[1:]):          # a preemption is always followed by a resume
            assert not (a == "preempted" and b != "loaded"), (key, names)
        preempted += body.count("preempted")
    assert preempted == sum(out["stats"]["preemptions"] for out in per_rank) > 0
    # a preemption names the primitive that waited, and how long: 500 int64 run one-shot
    # with a GPU's slots, in the ring with the simulator's
    _, slot_bytes = machine_sizes(2)
    primitives = (("sendAll", "recvReduceCopyAll") if one_shot(500, 8, 2, slot_bytes) else
                  ("send", "recvReduceSend", "recvReduceCopySend", "recvCopySend", "recv"))
    for e in events:
        if e["event"] == "preempted":
            assert e["primitive"] in primitives, e
            assert e["waited_ns"] > 0, e
    assert {e["event"] for e in events} >= {"launched", "absorbed", "loaded", "completed"}
    for e in events:        # a launch says where the block runs (%smid; 0 simulated)
        if e["event"] == "launched":
            assert isinstance(e["sm"], int) and e["sm"] >= 0, e

    chrome = to_chrome(events)
    json.dumps(chrome)
    slices = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == sum(n.count("loaded") for n in runs.values())
    assert {s["args"]["ended"] for s in slices} <= {"preempted", "completed"}


def test_blocks_beyond_a_collectives_channels_leave_its_runs_alone():
    """One element takes one of the three blocks' channels, 96 take all three (slots of 64
    bytes): the other blocks log nothing of the small one's runs, and both complete, each
    run once, with exact sums."""
    counts, runs = (1, 96), 3
    assert [channel_count(True, n, 8, 2, 3, 64) for n in counts] == [1, 3]
    per_rank = pydfccl.launch(rank_workers.traced_counts, 2, args=(counts, runs), nblocks=3,
                              slot_bytes=64, timeout=300)
    for k, n in enumerate(counts):
        want = sum(shared_workers.rank_inputs(r, n, "int64", k) for r in range(2)).tolist()
        assert all(out["results"][k] == want for out in per_rank), k
    assert all(out["lost"] == 0 and out["stats"]["completed"] == runs * len(counts)
               for out in per_rank)
    completed = {}
    for out in per_rank:
        for e in out["trace"]:
            if e["event"] == "completed":
                key = (e["rank"], e["coll"])
                completed.setdefault(key, []).append(e["block"])
    for rank in range(2):
        assert sorted(completed[rank, 0]) == [0] * runs
        assert sorted(completed[rank, 1]) == sorted([0, 1, 2] * runs)
    assert not any(e["block"] > 0 and e["coll"] == 0 for out in per_rank for e in out["trace"])


def test_demo_writes_a_timeline_and_a_picture(tmp_path, capsys):
    from pydfccl.cli.demo import main

    trace, picture = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["-n", "2", "-k", "3", "-i", "1", "-c", "20", "--no-progress",
                 "--trace", str(trace), "--plot", str(picture)]) == 0
    assert "host marks moved onto its daemon's clock by" in capsys.readouterr().out
    chrome = json.loads(trace.read_text())
    assert {e["pid"] for e in chrome["traceEvents"]} == {0, 1}
    assert any(e["ph"] == "X" and e["name"] == "all_reduce 2" for e in chrome["traceEvents"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_lays_the_hosts_marks_beside_the_daemons_events():
    """With a trace, each rank's host marks its submissions and results, moved onto its
    daemon's clock (``clock_offset_ns``; a GPU's is apart from the host's): one offset puts
    every run's absorbing after the host began submitting and its completion before the
    host has its result."""
    from pydfccl.cli.demo import DemoOptions, run_demo
    from pydfccl.host.trace import HOST_TRACK

    opts = DemoOptions(nranks=2, colls=3, iters=2, count=20, progress=False, trace=True)
    per_rank = run_demo(opts)
    for rank, out in enumerate(per_rank):
        events = sorted(out["trace"], key=lambda e: e["t_ns"])
        host = [e for e in events if e["block"] == HOST_TRACK]
        assert [e["event"] for e in host].count("host: submitting") == 2
        assert sorted(e["coll"] for e in host if e["event"] == "host: result") == [0, 0, 1, 1,
                                                                                  2, 2]
        for it in range(2):
            began = next(e["t_ns"] for e in host
                         if e["event"] == "host: submitting" and e["loop"] == it)
            for k in range(3):
                result = next(e["t_ns"] for e in host if e["event"] == "host: result"
                              and e["loop"] == it and e["coll"] == k)
                within = range(began, result + 1)
                absorbed = [e["t_ns"] for e in events
                            if e["event"] == "absorbed" and e["coll"] == k
                            and e["t_ns"] in within]
                completed = [e["t_ns"] for e in events
                             if e["event"] == "completed" and e["coll"] == k
                             and e["t_ns"] in within]
                assert absorbed and completed, (rank, it, k)
    chrome = to_chrome([e for out in per_rank for e in out["trace"]])["traceEvents"]
    assert {(e["pid"], e["args"]["name"]) for e in chrome if e["name"] == "thread_name"} == \
        {(0, "host"), (1, "host")}
    assert any(e["name"] == "host: result collective 2" and e["tid"] == HOST_TRACK
               for e in chrome)


def test_host_marks_move_onto_the_daemons_clock_by_the_runs_bounds():
    from pydfccl.host.trace import (MARK_RESULT, MARK_RUN, MARK_SUBMITTING, clock_offset_ns,
                               on_daemon_clock)

    us, ahead = 1000, 5_000_000          # the daemon's clock reads 5 ms more than the host's

    def mark(t, what, coll=None):
        return dict(t_ns=t * us, rank=0, block=-1, event=what, coll=coll, loop=0, step=0)

    def event(t, what, coll, block=0):
        return dict(t_ns=t * us + ahead, rank=0, block=block, event=what, coll=coll, loop=0,
                    step=0)

    marks = [mark(0, MARK_SUBMITTING), mark(10, MARK_RUN, 0), mark(20, MARK_RUN, 1),
             mark(100, MARK_RESULT, 0), mark(120, MARK_RESULT, 1)]
    events = [event(8, "absorbed", 0), event(15, "absorbed", 1), event(90, "completed", 0),
              event(110, "completed", 1), event(-900, "absorbed", 0, block=1)]

    # bounds: the offset is at most 5 ms + 5 us (run 1 absorbed 5 us after run 0's mark)
    # and at least 5 ms - 10 us (each completed 10 us before its result): the middle
    assert clock_offset_ns(marks, events) == ahead - 2500
    moved = on_daemon_clock(marks, ahead - 2500)
    assert [m["t_ns"] - m0["t_ns"] for m, m0 in zip(moved, marks)] == [ahead - 2500] * 5
    assert [m["event"] for m in moved] == [m["event"] for m in marks]
    # collective 0 with its absorbing lost is left out: its completion 1 us before its
    # result would have raised the lower bound to 5 ms - 1 us
    lost = [event(15, "absorbed", 1), event(99, "completed", 0), event(110, "completed", 1)]
    assert clock_offset_ns(marks, lost) == ahead - 2500
    assert clock_offset_ns(marks, lost + [event(8, "absorbed", 0)]) == ahead + 2000
    assert clock_offset_ns(marks, []) == 0


class _Pool:
    """A pool's header in host memory, as ``DeviceBuffer.read`` serves it."""

    def __init__(self, nblocks):
        from pydfccl.protocol import layout as L

        self.raw = np.zeros(L.P_TRACE + nblocks * L.TRACE_CAP * L.TRACE_SIZE, np.uint8)
        self.heads = self.raw[L.P_TRACE_HEAD:L.P_TRACE_HEAD + 8 * nblocks].view(np.int64)
        self.rings = self.raw[L.P_TRACE:].view(L.TRACE_EVENT).reshape(nblocks, L.TRACE_CAP)

    def read(self, offset, nbytes):
        return self.raw[offset:offset + nbytes].copy()

    def log(self, block, n, coll=0):
        """The daemon's side: ``n`` more "loaded" records on ``block``, t counting up."""
        from pydfccl.protocol import layout as L

        for _ in range(n):
            head = int(self.heads[block])
            self.rings[block, head % L.TRACE_CAP] = (head, 2, coll, 0, 0, 0)
            self.heads[block] = head + 1


def test_the_host_keeps_the_latest_events_within_its_bound():
    from pydfccl.host.trace import TraceReader

    pool = _Pool(nblocks=2)
    reader = TraceReader(pool, rank=0, nblocks=2, coll_ids={0: 7}, keep=100)
    for _ in range(5):             # 5 drains of 30 + 10 records: 200 read, 100 kept
        pool.log(0, 30)
        pool.log(1, 10)
        reader.drain()
    events = reader.events()
    assert len(events) == 100 and reader.dropped == 100 and reader.lost == 0
    assert {e["coll"] for e in events} == {7} and {e["event"] for e in events} == {"loaded"}
    last = [e["t_ns"] for e in events if e["block"] == 0]
    assert last == list(range(150 - len(last), 150))      # block 0's latest, in order
    pool.log(0, 5000)              # more than a ring holds between two drains
    reader.drain()
    assert reader.lost == 5000 - 4096 and reader.dropped == 100 + 4096


def test_closing_the_reader_waits_for_a_drain_and_ends_device_reads():
    """A communicator's close() closes its reader: a drain in progress (a device copy on the
    poller's tracer thread) ends first, and none starts after, so that the pool can be
    freed as soon as close() returns."""
    import threading

    from pydfccl.host.trace import TraceReader

    class SlowPool(_Pool):
        def __init__(self, nblocks):
            super().__init__(nblocks)
            self.reads, self.reading, self.go_on = 0, threading.Event(), threading.Event()

        def read(self, offset, nbytes):
            self.reads += 1
            self.reading.set()
            assert self.go_on.wait(10)
            return super().read(offset, nbytes)

    pool = SlowPool(nblocks=1)
    pool.log(0, 3)
    reader = TraceReader(pool, rank=0, nblocks=1, coll_ids={0: 0})
    drain = threading.Thread(target=reader.drain)
    drain.start()
    assert pool.reading.wait(10)
    closing = threading.Thread(target=reader.close)
    closing.start()
    closing.join(0.2)
    assert closing.is_alive()          # waits for the drain's copy
    pool.go_on.set()
    drain.join(10)
    closing.join(10)
    assert not closing.is_alive()
    reads = pool.reads
    pool.log(0, 2)
    assert len(reader.events()) == 3 and pool.reads == reads    # kept; no read after close


def test_the_drain_waits_longer_while_the_rings_stay_nearly_empty():
    """Each drain is device copies that hand the GIL around rank threads: the wait doubles
    while the fullest ring gets under an eighth between drains, up to the longest, and
    drops to the shortest once one gets a quarter full."""
    from pydfccl.host.trace import TRACE_DRAIN_SECONDS, next_drain_interval
    from pydfccl.protocol import layout as L

    shortest, longest = TRACE_DRAIN_SECONDS
    waits = [shortest]
    for _ in range(10):
        waits.append(next_drain_interval(waits[-1], L.TRACE_CAP // 8 - 1))
    assert waits[:3] == [shortest, 2 * shortest, 4 * shortest] and waits[-1] == longest
    assert next_drain_interval(0.08, L.TRACE_CAP // 8) == 0.08          # in between: kept
    assert next_drain_interval(longest, L.TRACE_CAP // 4) == shortest


def test_a_drain_reports_the_most_new_records_of_a_block():
    from pydfccl.host.trace import TraceReader

    pool = _Pool(nblocks=2)
    reader = TraceReader(pool, rank=0, nblocks=2, coll_ids={0: 7})
    pool.log(0, 30)
    pool.log(1, 70)
    assert reader.drain() == 70
    pool.log(0, 5)
    assert reader.drain() == 5 and reader.drain() == 0
    assert len(reader.events()) == 105 and reader.lost == 0
