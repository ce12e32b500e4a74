"""Probe (GPU only): where the time of large all-reduces with many channels goes.

One thread drives every rank (``init_all``), as ``bench``'s sweep does. For each policy and
size it times runs waited one by one and runs submitted back to back (up to 8 in flight),
then writes every rank's daemon event log (``Communicator.trace()``) to
``$OUT/probe_big_<policy>.json.gz`` for a look at which blocks waited, and when.
Run: python3 scripts/probe_big.py [--policies dfccl nccl] [--sizes 16777216 268435456]
"""
import argparse
import gzip
import json
import os
import time

import numpy as np

from pydfccl import close_all, init_all, start_all
from pydfccl.sched.policies import get_policy
from pydfccl.sweep import parse_params


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


def probe(name, policy, sizes, nranks, nblocks, slot_bytes, iters, out):
    comms = init_all(nranks, policy=policy, nblocks=nblocks, slot_bytes=slot_bytes)
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
        with gzip.open(os.path.join(out, f"probe_big_{name}.json.gz"), "wt") as f:
            json.dump(dict(policy=name, sizes=sizes, nblocks=nblocks, slot_bytes=slot_bytes,
                           iters=iters, marks=marks, lost=lost, events=events), f)
        print(f"{name}: {len(events)} events, {lost} lost", flush=True)
    finally:
        close_all(comms)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--policies", nargs="+", default=["dfccl", "nccl"])
    p.add_argument("--sizes", nargs="+", type=int, default=[16 << 20, 256 << 20])
    p.add_argument("--nranks", type=int, default=4)
    p.add_argument("--nblocks", type=int, default=32)
    p.add_argument("--slot-bytes", type=int, default=512 << 10)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--param", action="append", default=[],
                   help="NAME=VALUE: a parameter of every policy but nccl (as bench's)")
    args = p.parse_args()
    out = os.environ.get("OUT", ".")
    params = parse_params(args.param)
    for name in args.policies:
        policy = get_policy(name)
        if params and name != "nccl":
            policy = policy.with_params(**params)
        probe(name, policy, args.sizes, args.nranks, args.nblocks, args.slot_bytes, args.iters,
              out)


if __name__ == "__main__":
    main()
