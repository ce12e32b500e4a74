"""Where a network proxy's time goes, for ``bench net`` to show beside its latencies.

Three durations, each kept for the last ``KEEP`` events: the gap between the starts of two
of the proxy's loops (its idle sleep included: far above that sleep, the thread waited for
the GIL or the CPU), the copy of a received slot and its tail into the rank's pool, and a
message's transit from the sender's proxy noticing it to the receiver's proxy handling it
(the monotonic clock is one clock only among the processes of one machine).
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["KEEP", "ProxyTimings", "timings_table"]

KEEP = 4096
KINDS = ("loop gap", "pool write", "transit")


class ProxyTimings:
    """The last ``KEEP`` of each of ``KINDS``, in seconds."""

    def __init__(self):
        self._samples = {kind: deque(maxlen=KEEP) for kind in KINDS}

    def add(self, kind: str, seconds: float) -> None:
        self._samples[kind].append(seconds)

    def summary(self) -> dict:
        """{kind: (count, median, 99th percentile, max) in microseconds}; a kind with no
        samples is left out."""
        out = {}
        for kind, samples in self._samples.items():
            if samples:
                us = np.array(samples) * 1e6
                out[kind] = (len(us), float(np.median(us)), float(np.percentile(us, 99)),
                             float(us.max()))
        return out


def timings_table(per_rank: list[dict], one_machine: bool) -> list[str]:
    """Lines that show every rank's ``ProxyTimings.summary()`` (None: no proxy); transit
    only where the ranks share one machine's clock."""
    lines = [f"{'rank':>4} {'what':<11} {'count':>6} {'median us':>10} {'p99 us':>9} "
             f"{'max us':>9}"]
    for rank, summary in enumerate(per_rank):
        for kind, (count, median, p99, top) in (summary or {}).items():
            if kind == "transit" and not one_machine:
                continue
            lines.append(f"{rank:>4} {kind:<11} {count:>6} {median:>10.1f} {p99:>9.1f} "
                         f"{top:>9.1f}")
    return lines
