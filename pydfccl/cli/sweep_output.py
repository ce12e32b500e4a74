"""What the size sweep reports: nccl-tests' table (with what the timed runs cost and a
baseline's time over the daemon's), the median of ``-N`` cycles, and the rows as CSV,
JSON and a plot."""

from __future__ import annotations

import csv
import json
import numpy as np

from .options import options_record
from .sweep_spec import SweepOptions

__all__ = ["format_table", "mode_table", "cycle_line", "median_rows", "paired_ratios",
           "combine_cycles", "write_csv", "write_json", "plot"]


def format_table(rows: list[dict], base: dict | None) -> str:
    """nccl-tests' columns, then what the timed runs cost in preemptions and kernel
    launches (all ranks; N/A for NCCL itself), the fastest and slowest cycle's times when
    the sweep ran several (``-N``), and the time over the daemon's for a baseline (with
    several cycles also ``x paired``: see ``paired_ratios``)."""
    spread = "time_min_us" in rows[0]
    paired = "x_daemon_paired" in rows[0]
    head = (f"{'mode':>8} {'size(B)':>12} {'count':>10} {'type':>8} {'redop':>6} {'root':>5} "
            f"{'time(us)':>10} {'algbw(GB/s)':>12} {'busbw(GB/s)':>12} {'#wrong':>7} "
            f"{'preempt':>8} {'launches':>8}")
    if spread:
        head += f" {'min(us)':>10} {'max(us)':>10}"
    if base:
        head += f" {'x daemon':>9}"
    if paired:
        head += f" {'x paired':>9}"
    lines = [head]
    for r in rows:
        line = (f"{r['mode']:>8} {r['size']:>12} {r['count']:>10} {r['type']:>8} "
                f"{r['redop']:>6} {r['root']:>5} {r['time_us']:>10.1f} {r['algbw']:>12.3f} "
                f"{r['busbw']:>12.3f} {r['wrong'] if r['wrong'] >= 0 else 'N/A':>7} "
                f"{_count(r['preemptions']):>8} {_count(r['launches']):>8}")
        if spread:
            line += f" {r['time_min_us']:>10.1f} {r['time_max_us']:>10.1f}"
        if base:
            line += f" {r['time_us'] / base[r['size']]:>9.2f}"
        if paired:
            line += f" {r['x_daemon_paired']:>9.2f}"
        lines.append(line)
    return "\n".join(lines)


def _count(n: int) -> str:
    return str(n) if n >= 0 else "N/A"


def mode_table(rows: list[dict], daemon_rows: list[dict]) -> str:
    """A mode's table (with its time over the daemon's, unless it is the daemon's) and its
    average bus bandwidth."""
    base = None if rows is daemon_rows else {r["size"]: r["time_us"] for r in daemon_rows}
    return (f"{format_table(rows, base)}\n# {rows[0]['mode']}: Avg bus bandwidth    : "
            f"{np.mean([r['busbw'] for r in rows]):.3f} GB/s")


def cycle_line(cycle: int, cycles: int, mode: str, rows: list[dict]) -> str:
    """A line a cycle, with every size's time: a sweep cut off by a time limit still leaves
    its figures."""
    return (f"# cycle {cycle + 1}/{cycles}, {mode}: Avg bus bandwidth    : "
            f"{np.mean([r['busbw'] for r in rows]):.3f} GB/s; time(us) by size(B): "
            + " ".join(f"{r['size']}:{r['time_us']:.1f}" for r in rows))


def median_rows(cycles: list[list[dict]]) -> list[dict]:
    """One mode's rows from several cycles of the sweep: at each size the row of the cycle
    with the median time (the lower one of an even count), its fastest and slowest times
    beside it, and #wrong summed over every cycle."""
    if len(cycles) == 1:
        return cycles[0]
    rows = []
    for same_size in zip(*cycles):
        ranked = sorted(same_size, key=lambda r: r["time_us"])
        wrongs = [r["wrong"] for r in same_size]
        rows.append(dict(ranked[(len(ranked) - 1) // 2], cycles=len(ranked),
                         time_min_us=ranked[0]["time_us"], time_max_us=ranked[-1]["time_us"],
                         wrong=sum(wrongs) if min(wrongs) >= 0 else -1))
    return rows


def paired_ratios(rows: list[dict], cycles: list[list[dict]], daemon: list[list[dict]]):
    """Add to a baseline's median rows ``x_daemon_paired``: at each size the median over
    the cycles of its time over the daemon's in the same cycle. The two runs of a pair are
    seconds apart, where the cycles' medians may be minutes apart, so a drift of the host
    between cycles moves this ratio less than it moves ``x daemon``."""
    for i, row in enumerate(rows):
        row["x_daemon_paired"] = float(np.median(
            [mine[i]["time_us"] / theirs[i]["time_us"] for mine, theirs in zip(cycles, daemon)]))


def combine_cycles(cycles: dict) -> dict:
    """{mode: rows}: each mode's median rows over its cycles (``run_cycles``' result), a
    baseline's with ``x_daemon_paired`` when there were several."""
    results = {mode: median_rows(runs) for mode, runs in cycles.items()}
    if len(cycles["daemon"]) > 1:
        for mode in results:
            if mode != "daemon":
                paired_ratios(results[mode], cycles[mode], cycles["daemon"])
    return results


def write_csv(rows: list[dict], path: str) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))   # the HBM keys: some rows
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_json(opts: SweepOptions, rows: list[dict], path: str) -> None:
    with open(path, "w") as f:
        json.dump(dict(options=options_record(opts), rows=rows), f, indent=1)


def plot(results: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, rows in results.items():
        ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], marker="o", label=mode)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
