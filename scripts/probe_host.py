"""Probe (any machine): what short sleeps, yields and thread hand-offs cost in Python here.

The daemon answers in microseconds, so the host's polling and waking decide the latency of
a small collective. Prints the median and 90th percentile of: time.sleep(0),
time.sleep(2e-6) with default and 1 ns timer slack, os.sched_yield(), and the wake-up of a
thread blocked on a threading.Event set by another thread.
Run: python3 scripts/probe_host.py
"""
import os
import threading
import time

import numpy as np

from pydfccl.platform import precise_sleeps


def _time(fn, n=2000):
    out = np.empty(n)
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        out[i] = time.perf_counter() - t0
    return out * 1e6


def _handoff(n=500):
    go, back = threading.Event(), threading.Event()
    lat = np.empty(n)
    stamp = [0.0]

    def partner():
        for i in range(n):
            go.wait()
            go.clear()
            lat[i] = time.perf_counter() - stamp[0]
            back.set()

    t = threading.Thread(target=partner)
    t.start()
    for _ in range(n):
        stamp[0] = time.perf_counter()
        go.set()
        back.wait()
        back.clear()
    t.join()
    return lat * 1e6


def main():
    rows = [("time.sleep(0)", _time(lambda: time.sleep(0))),
            ("time.sleep(2e-6)", _time(lambda: time.sleep(2e-6))),
            ("os.sched_yield()", _time(os.sched_yield)),
            ("Event hand-off to a thread", _handoff())]
    precise_sleeps()
    rows += [("time.sleep(2e-6), 1 ns slack", _time(lambda: time.sleep(2e-6))),
             ("time.sleep(0), 1 ns slack", _time(lambda: time.sleep(0)))]
    print(f"{'what':<32} {'median us':>10} {'p90 us':>8}")
    for name, t in rows:
        print(f"{name:<32} {np.median(t):>10.1f} {np.percentile(t, 90):>8.1f}")


if __name__ == "__main__":
    main()
