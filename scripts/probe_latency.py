"""Probe (GPU only): where the time of a small all-reduce goes.

One Python thread drives the ranks (two by default; ``init_all``: no rank threads, so no GIL
hand-offs) and splits each run into: time inside the ranks' ``run()`` calls, time until
every CQ stamp is visible to a tight host loop, and the daemon's own absorbed-to-completed
time from its event log (%globaltimer), whose last runs it prints. Also times the host
pieces of ``run()`` alone.
Run: python3 scripts/probe_latency.py [iters] [nranks]
"""
import sys
import time
from concurrent.futures import Future

import numpy as np

from pydfccl import init_all, start_all
from pydfccl.protocol import layout as L
from pydfccl.host.buffers import buffer_info
from pydfccl.host.hostspin import SPINS_PER_CALL, wait_for_stamp
from probe_host import _time   # this script's folder is on its path


def main(iters=3000, nranks=2):
    comms = init_all(nranks)
    world = comms[0].world
    for c in comms:
        c.prepare(0, "all_reduce", count=2, dtype="float32")
    start_all(comms)
    xs = [c.empty(2, "float32") for c in comms]
    for r, x in enumerate(xs):
        x.copy_to_device(np.full(2, r + 1, np.float32))
    ys = [c.empty(2, "float32") for c in comms]
    stamps = [world.ctl["cq"]["stamp"][r] for r in range(nranks)]
    run_us, seen_us, done_us = (np.empty(iters) for _ in range(3))
    for i in range(iters + 200):
        marks = [("host: submit begins", time.time_ns())]
        t0 = time.perf_counter()
        futs = []
        for r, (c, x, y) in enumerate(zip(comms, xs, ys)):
            futs.append(c.run(0, x, y))
            marks.append((f"host: rank {r}'s run() returned", time.time_ns()))
        t1 = time.perf_counter()
        k = i    # each iteration completes one CQ entry per rank
        for r, s in enumerate(stamps):   # watched without the GIL: the poller is not held off
            while not wait_for_stamp(s.ctypes.data + (k % L.CQ_CAP) * s.strides[0], k + 1,
                                     SPINS_PER_CALL):
                pass
            marks.append((f"host: rank {r}'s CQ stamp seen", time.time_ns()))
        t2 = time.perf_counter()
        for r, f in enumerate(futs):
            f.result(timeout=30)
            marks.append((f"host: rank {r}'s result() returned", time.time_ns()))
        t3 = time.perf_counter()
        if i >= 200:
            j = i - 200
            run_us[j], seen_us[j], done_us[j] = t1 - t0, t2 - t0, t3 - t0
    got = ys[0].copy_to_host()
    assert np.all(got == nranks * (nranks + 1) / 2), got
    events = [c.trace() for c in comms]
    ev = events[0]
    absorbed = {}
    gpu = []
    for e in ev:
        if e["block"] != 0:
            continue
        if e["event"] == "absorbed":
            absorbed[e["coll"]] = e["t_ns"]
        elif e["event"] == "completed" and e["coll"] in absorbed:
            gpu.append(e["t_ns"] - absorbed.pop(e["coll"]))
    last = [e for evs in events for e in evs if e["event"] != "quit"]
    t_end = max(e["t_ns"] for e in last)
    window = sorted((e for e in last if e["t_ns"] > t_end - 75_000 * nranks),
                    key=lambda e: e["t_ns"])
    print("the last runs, as the daemons logged them (us before the last event), with the "
          "host's marks of the last run (time.time_ns(); %globaltimer counts from the same "
          "epoch if the driver keeps it so, which the order of the lines shows):")
    lines = [((e["t_ns"] - t_end) / 1e3, f"rank {e['rank']} block {e['block']} "
              f"{e['event']:<10} coll {e['coll']} step {e['step']}")
             for e in window[-12 * nranks:]]
    lines += [((t - t_end) / 1e3, what) for what, t in marks]
    for t, what in sorted(lines):
        print(f"  {t:8.1f}  {what}")
    launches = [c.stats()["launches"] for c in comms]
    for c in comms:
        c.close()
    print(f"single controller, {nranks} ranks, {iters} runs of an 8-byte all-reduce")
    print(f"{'what':<44} {'median us':>10} {'p90 us':>8}")
    for name, v in [("all run() calls", run_us * 1e6), ("submit -> every CQ stamp seen", seen_us * 1e6),
                    ("submit -> every future done", done_us * 1e6),
                    ("daemon rank 0 absorbed -> completed", np.array(gpu[-iters:]) / 1e3)]:
        print(f"{name:<44} {np.median(v):>10.1f} {np.percentile(v, 90):>8.1f}")
    print(f"daemon launches per rank: {launches}")
    x = xs[0]
    print(f"{'host pieces':<44} {'median us':>10}")
    for name, fn in [("x.__cuda_array_interface__", lambda: x.__cuda_array_interface__),
                     ("buffer_info(x)", lambda: buffer_info(x)),
                     ("Future()", Future),
                     ("ctl numpy field write", lambda: stamps[0].__setitem__(255, 0))]:
        print(f"{name:<44} {np.median(_time(fn)):>10.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3000,
         int(sys.argv[2]) if len(sys.argv) > 2 else 2)
