"""Where a network proxy's time goes, for ``bench net`` to show beside its latencies.

Three durations, each kept for the last ``KEEP`` events since they were last taken: the gap
between the starts of two of the proxy's loops (its idle sleep included: far above that
sleep, the thread waited for the GIL or the CPU), the copy of a received slot and its tail
into the rank's pool, and a message's transit from the sender's proxy noticing it to the
receiver's proxy handling it (the monotonic clock is one clock only among the processes of
one machine).
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["KEEP", "KINDS", "ProxyTimings", "timings_table"]

KEEP = 4096
KINDS = ("loop gap", "pool write", "transit")


class ProxyTimings:
    """The last ``KEEP`` of each of ``KINDS``, in seconds."""

    def __init__(self):
        self._samples = {kind: deque(maxlen=KEEP) for kind in KINDS}

    def add(self, kind: str, seconds: float) -> None:
        self._samples[kind].append(seconds)

    def take(self) -> dict:
        """{kind: the samples since the last take, in microseconds}, and start afresh."""
        out = {}
        for kind, samples in self._samples.items():
            out[kind] = np.array(samples) * 1e6
            samples.clear()
        return out


def timings_table(by_size: dict, one_machine: bool) -> list[str]:
    """Lines with each size's median and 99th percentile of each kind, over the samples of
    every rank (``by_size``: {bytes: [each rank's ``take()``]}); transit only where the
    ranks share one machine's clock, and '-' where a kind has no samples."""
    kinds = [k for k in KINDS if one_machine or k != "transit"]
    head = "".join(f" {kind + ' us':>13} {'p99':>9}" for kind in kinds)
    lines = [f"{'bytes':>10}{head}"]
    for size, ranks in by_size.items():
        row = f"{size:>10}"
        for kind in kinds:
            us = np.concatenate([r[kind] for r in ranks if r is not None] or [np.empty(0)])
            row += (f" {np.median(us):>13.1f} {np.percentile(us, 99):>9.1f}" if us.size
                    else f" {'-':>13} {'-':>9}")
        lines.append(row)
    return lines
