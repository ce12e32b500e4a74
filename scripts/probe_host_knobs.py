"""Probe (GPU only): which of the host's background threads slow a small all-reduce.

The 2-rank, 8-byte latency from one thread (``bench latency``'s ``--driver one`` path) under
settings of the host threads that share the GIL with the thread that submits and waits:
the poller's sleep while that thread drains its own completions (``SLEEP_WHEN_HELPED``)
and the event-log copier's period (``TRACE_DRAIN_SECONDS``). The settings take turns for
several rounds, so that drift on the host reaches them alike; each line is one round.
Run: python3 scripts/probe_host_knobs.py [iters] [rounds]
"""
import sys

import numpy as np

from pydfccl.host import poller as progress
from pydfccl.cli.bench import one_thread_latency

DEFAULTS = dict(SLEEP_WHEN_HELPED=progress.SLEEP_WHEN_HELPED,
                TRACE_DRAIN_SECONDS=progress.TRACE_DRAIN_SECONDS)
# (before eb7f423 the poller slept 100 us when helped; 09:11 on 2026-11-30 compared these
# four with 100 us as the default)
SETTINGS = {
    "defaults": {},
    "poller sleeps 100 us when helped": dict(SLEEP_WHEN_HELPED=1e-4),
    "event logs copied every 1 s": dict(TRACE_DRAIN_SECONDS=1.0),
    "poller 100 us, logs every 1 s": dict(SLEEP_WHEN_HELPED=1e-4, TRACE_DRAIN_SECONDS=1.0),
}


def main(iters=3000, rounds=5):
    medians = {name: [] for name in SETTINGS}
    for r in range(rounds):
        for name, knobs in SETTINGS.items():
            for k, v in {**DEFAULTS, **knobs}.items():
                setattr(progress, k, v)
            out = one_thread_latency(2, iters, 200, 2, "float32", "dfccl", True)
            medians[name].append(out["median"])
            print(f"round {r + 1}: {name:32s} median {out['median']:7.1f} us  "
                  f"p10 {out['p10']:7.1f}  p90 {out['p90']:7.1f}", flush=True)
    print(f"{'setting':32s} median of the rounds' medians (us)")
    for name, values in medians.items():
        print(f"{name:32s} {np.median(values):7.1f}")


if __name__ == "__main__":
    main(*map(int, sys.argv[1:]))
