"""Probe (GPU only): where the time of large all-reduces with many channels goes.

One thread drives every rank (``init_all``), as ``bench``'s sweep does. For each policy and
size it times runs waited one by one and runs submitted back to back (up to 8 in flight),
then writes every rank's daemon event log (``Communicator.trace()``) to
``$OUT/probe_big_<policy>_<channels>ch.json.gz`` for a look at which blocks waited, and when;
``--summarize FILE...`` prints what such a log says (no GPU needed).
Run: python3 scripts/probe_big.py [--policies dfccl nccl] [--sizes 16777216 268435456]
"""
import argparse
import collections
import gzip
import json
import os
import time

import numpy as np

from pydfccl import close_all, init_all, start_all
from pydfccl.sched.policies import get_policy
from pydfccl.cli.options import parse_params


def timed(comms, buffers, coll, iters, back_to_back):
    t0 = time.perf_counter()
    if back_to_back:
        futures = [c.run(coll, *b[coll]) for _ in range(iters) for c, b in zip(comms, buffers)]
        for f in futures:
            f.result(timeout=120)
    else:
        for _ in range(iters):
            for f in [c.run(coll, *b[coll]) for c, b in zip(comms, buffers)]:
                f.result(timeout=120)
    return (time.perf_counter() - t0) / iters * 1e6


def probe(name, policy, sizes, nranks, world, iters, out):
    """``world``: the WorldConfig sizes (nblocks, slot_bytes, max_colls: None for the
    default)."""
    world = {k: v for k, v in world.items() if v is not None}
    comms = init_all(nranks, policy=policy, **world)
    nblocks, slot_bytes = world["nblocks"], world["slot_bytes"]
    pool_mib = comms[0].world.config.pool_bytes / 2**20
    try:
        for c in comms:
            for i, size in enumerate(sizes):
                c.prepare(i, "all_reduce", count=size // 4, dtype="float32")
        start_all(comms)
        buffers = []
        for c in comms:
            mine = []
            for size in sizes:
                x = c.empty(size // 4, "float32")
                x.copy_to_device(np.full(size // 4, c.rank + 1, np.float32))
                mine.append((x, c.empty(size // 4, "float32")))
            buffers.append(mine)
        marks = []
        for i, size in enumerate(sizes):
            timed(comms, buffers, i, 2, False)              # warm-up
            for back_to_back in (False, True):
                before = [c.stats() for c in comms]
                us = timed(comms, buffers, i, iters, back_to_back)
                after = [c.stats() for c in comms]
                cost = {k: sum(a[k] - b[k] for a, b in zip(after, before))
                        for k in ("preemptions", "launches")}
                marks.append(dict(size=size, back_to_back=back_to_back, us=us, **cost))
                print(f"{name:>6} {size:>10} {'back-to-back' if back_to_back else 'one by one':>12}"
                      f" {us:10.1f} us/run  preempt {cost['preemptions']:>5}"
                      f"  launches {cost['launches']:>3}", flush=True)
        want = nranks * (nranks + 1) / 2
        for mine in buffers:
            for _, y in mine:
                got = y.copy_to_host()
                assert np.all(got == want), (got[:4], want)
        events = [e for c in comms for e in c.trace()]
        lost = sum(c.trace_lost() for c in comms)
        tag = (f"_{slot_bytes >> 10}k_{world['max_colls']}colls" if "max_colls" in world
               else "") + (f"_{nranks}ranks" if nranks != 4 else "")
        path = os.path.join(out, f"probe_big_{name}_{nblocks}ch{tag}.json.gz")
        with gzip.open(path, "wt") as f:
            json.dump(dict(policy=name, sizes=sizes, nblocks=nblocks, slot_bytes=slot_bytes,
                           pool_mib=pool_mib,
                           iters=iters, marks=marks, lost=lost, events=events), f)
        print(f"{name}: {len(events)} events, {lost} lost", flush=True)
    finally:
        close_all(comms)


def summarize(data: dict) -> list[str]:
    """What a probe's event log says, size by size: how long a block took from loading its
    share of a run to completing it (median over runs; the fastest and slowest block's
    median beside it), how far apart in time the ranks took the same run from the SQ, and
    how many times each rank's daemon was launched, and (logs with the blocks'
    multiprocessors) how the blocks that worked shared multiprocessors."""
    runs = collections.defaultdict(list)       # (coll, rank, block) -> its events in order
    launches = collections.Counter()
    sm_of = {}                                 # (rank, block) -> its last launch's SM
    for e in sorted(data["events"], key=lambda e: e["t_ns"]):
        if e["event"] == "launched":
            launches[e["rank"]] += 1
            if "sm" in e:
                sm_of[(e["rank"], e["block"])] = e["sm"]
        elif e["coll"] is not None:
            runs[(e["coll"], e["rank"], e["block"])].append(e)
    pool = f", a {data['pool_mib']:.0f} MiB pool a rank" if "pool_mib" in data else ""
    lines = [f"{data['policy']}, {data['nblocks']} channels x {data['slot_bytes']} B{pool}: "
             f"launches per rank " + ", ".join(f"{launches[r] // data['nblocks']}"
                                                for r in sorted(launches))]
    if sm_of:
        lines.append("  " + _sharing("daemon blocks", list(sm_of.values())))
    for coll, size in enumerate(data["sizes"]):
        spans, absorbed = {}, collections.defaultdict(list)   # block medians; rank -> times
        for (c, rank, block), events in runs.items():
            if c != coll:
                continue
            mine, start = [], None
            for e in events:
                if e["event"] == "loaded" and start is None:
                    start = e["t_ns"]
                elif e["event"] == "completed" and start is not None:
                    mine.append(e["t_ns"] - start)
                    start = None
            if mine:
                spans[(rank, block)] = float(np.median(mine)) / 1e3
            taken = [e["t_ns"] for e in events if e["event"] == "absorbed"]
            prev = absorbed[rank]
            absorbed[rank] = [min(a, b) for a, b in zip(prev, taken)] if prev else taken
        if not spans:
            continue
        k = min(len(t) for t in absorbed.values())
        apart = [(max(t[i] for t in absorbed.values()) - min(t[i] for t in absorbed.values()))
                 / 1e3 for i in range(k)]
        values = sorted(spans.values())
        lines.append(f"  {size:>10} B: a block's share of a run {np.median(values):8.1f} us "
                     f"(blocks {values[0]:.1f} to {values[-1]:.1f}); ranks took a run "
                     f"{np.median(apart):.1f} us apart (at most {max(apart):.1f}), {k} runs")
        working = [sm_of[key] for key in spans if key in sm_of]
        if working:
            lines.append(f"  {size:>10} B: " + _sharing("blocks with a share", working))
    return lines


def run_spans(data: dict) -> list[str]:
    """For runs that most blocks have no share of (small sizes): per rank and run, how long
    from the first block's taking the run off the SQ to the last block's taking it, and to
    the last block's completing it (which writes the CQ), medians over the runs; and which
    blocks were most often the last to complete."""
    taken = collections.defaultdict(list)      # (coll, rank, block) -> absorbed times
    done = collections.defaultdict(list)       # (coll, rank, block) -> completed times
    for e in sorted(data["events"], key=lambda e: e["t_ns"]):
        if e["coll"] is not None and e["event"] in ("absorbed", "completed"):
            (taken if e["event"] == "absorbed" else done)[(e["coll"], e["rank"], e["block"])
                                                          ].append(e["t_ns"])
    lines = []
    for coll, size in enumerate(data["sizes"]):
        spread, total, share, last = [], [], [], collections.Counter()
        for rank in sorted({k[1] for k in taken if k[0] == coll}):
            blocks = [b for (c, r, b) in taken if c == coll and r == rank]
            n = min(min(len(taken[(coll, rank, b)]), len(done[(coll, rank, b)])) for b in blocks)
            for i in range(n):
                a = {b: taken[(coll, rank, b)][i] for b in blocks}
                d = {b: done[(coll, rank, b)][i] for b in blocks}
                first = min(a.values())
                spread.append((max(a.values()) - first) / 1e3)
                total.append((max(d.values()) - first) / 1e3)
                share.append((d[0] - first) / 1e3)
                last[max(d, key=d.get)] += 1
        if total:
            lines.append(f"  {size:>10} B, {data['nblocks']} blocks: first take -> last take "
                         f"{np.median(spread):.1f} us, -> block 0 completed "
                         f"{np.median(share):.1f} us, -> last completed {np.median(total):.1f} "
                         f"us (p90 {np.percentile(total, 90):.1f}); last to complete most "
                         f"often: blocks {[b for b, _ in last.most_common(4)]}")
    return lines


def event_gaps(data: dict, block: int = 0) -> list[str]:
    """Medians of the time from one event of ``block`` to its next of the same run's
    collective, over every rank (absorbed -> loaded is the block's own scheduling, which
    waits for nobody; loaded -> completed its share of a run): where a block's time goes,
    to compare worlds."""
    runs = collections.defaultdict(list)       # (rank, coll) -> the block's events in order
    for e in sorted(data["events"], key=lambda e: e["t_ns"]):
        if e["block"] == block and e["coll"] is not None:
            runs[(e["rank"], e["coll"])].append(e)
    gaps = collections.defaultdict(list)
    for events in runs.values():
        for a, b in zip(events, events[1:]):
            gaps[(a["event"], b["event"])].append((b["t_ns"] - a["t_ns"]) / 1e3)
    lines = [f"  block {block}, from an event to the next (median us, times):"]
    for (a, b), values in sorted(gaps.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"    {a:>9} -> {b:<9} {np.median(values):8.1f} ({len(values)})")
    return lines


def _sharing(what: str, sms: list) -> str:
    """How ``sms`` (one multiprocessor per block) spread: blocks, multiprocessors, most on one."""
    per_sm = collections.Counter(sms)
    return (f"{len(sms)} {what} on {len(per_sm)} multiprocessors, at most "
            f"{max(per_sm.values())} on one")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--summarize", nargs="+", metavar="FILE",
                   help="print what these event logs (probe_big_*.json.gz) say, and exit")
    p.add_argument("--policies", nargs="+", default=["dfccl", "nccl"])
    p.add_argument("--sizes", nargs="+", type=int, default=[16 << 20, 256 << 20])
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--nblocks", type=int, default=32)
    p.add_argument("--slot-bytes", type=int, default=512 << 10)
    p.add_argument("--max-colls", type=int, default=None,
                   help="collectives a communicator can hold (the pool's size grows with it)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--param", action="append", default=[],
                   help="NAME=VALUE: a parameter of every policy but nccl (as bench's)")
    args = p.parse_args()
    if args.summarize:
        for path in args.summarize:
            with gzip.open(path, "rt") as f:
                data = json.load(f)
            print("\n".join(summarize(data) + run_spans(data) + event_gaps(data)))
        return
    out = os.environ.get("OUT", ".")
    params = parse_params(args.param)
    for name in args.policies:
        policy = get_policy(name)
        if params and name != "nccl":
            policy = policy.with_params(**params)
        world = dict(nblocks=args.nblocks, slot_bytes=args.slot_bytes, max_colls=args.max_colls)
        probe(name, policy, args.sizes, args.nranks, world, args.iters, out)


if __name__ == "__main__":
    main()
