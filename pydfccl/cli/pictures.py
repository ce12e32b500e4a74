"""Pictures a student reads (matplotlib, the ``plot`` extra): the wait-for graph of a stuck
world, and a timeline of the daemons' events.

The timeline gives each collective a colour of its own and keeps every other mark out of
those colours: a preemption is a black cross, a daemon's quit and launch are grey ticks, a
stretch that never ended (the run deadlocked in it) is hatched. Each rank has a lane for its
host (run() returned, the device sync returned, results) and one for the budgets its
preemptions ran out of; the host's iteration starts are dashed lines across the rank's
lanes. Both pictures are drawn from plain data (``comm.trace()`` events, edges read from
``comm.status()``), so they are written the same when the run deadlocked.
"""

from __future__ import annotations

import math

from ..host.trace import HOST_TRACK, MARK_RESULT, MARK_RUN, MARK_SUBMITTING

__all__ = ["COLLECTIVE_COLOURS", "MARK_SYNCED", "MARK_DEADLOCK", "draw_wait_graph", "draw_timeline",
           "stretches"]

# Collectives' colours: distinct, and none of them red or black (the cycle's and the
# preemptions' colours) nor grey (the daemons' launches and quits).
COLLECTIVE_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
                      "#17becf", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5"]
MARK_SYNCED = "host: device sync returned"
MARK_DEADLOCK = "host: deadlock reported"     # where the watchdog's abort reached the host


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw_wait_graph(edges: list, path: str, title: str, cycle: list | None = None,
                    nranks: int | None = None, note: str | None = None) -> None:
    """Ranks as nodes on a circle, an arrow per wait (``edges``: (rank, peer it waits for,
    label such as "all_reduce 0")), the arrows of ``cycle`` (ranks, each waiting for the
    next) in red and thick; ``note`` replaces the line that says what the graph means."""
    plt = _pyplot()
    from matplotlib.patches import FancyArrowPatch

    ranks = sorted({r for e in edges for r in e[:2]} | set(range(nranks or 0)))
    n = max(len(ranks), 1)
    pos = {r: (math.cos(math.pi / 2 + 2 * math.pi * i / n) * (1 if n > 1 else 0),
               math.sin(math.pi / 2 + 2 * math.pi * i / n) * (1 if n > 1 else 0))
           for i, r in enumerate(ranks)}
    in_cycle = set()
    if cycle:
        in_cycle = {(a, cycle[(i + 1) % len(cycle)]) for i, a in enumerate(cycle)}
    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    for r, (x, y) in pos.items():
        ax.add_patch(plt.Circle((x, y), 0.22, facecolor="#f2f2f2", edgecolor="black", lw=1.5,
                                zorder=3))
        ax.text(x, y, f"rank {r}", ha="center", va="center", fontsize=12, zorder=4)
    seen: dict = {}
    pairs = {(a, b) for a, b, _ in edges}
    for rank, peer, label in edges:
        (x0, y0), (x1, y1) = pos[rank], pos[peer]
        hot = (rank, peer) in in_cycle
        k = seen.get((rank, peer), 0)
        seen[(rank, peer)] = k + 1
        bend = 0.35 + 0.15 * k
        dx, dy = x1 - x0, y1 - y0
        mx, my = (x0 + x1) / 2, (y0 + y1) / 2
        if (peer, rank) not in pairs and dy * mx - dx * my < 0:
            bend = -bend     # a lone arrow bulges away from the middle, its label outside
        arrow = FancyArrowPatch((x0, y0), (x1, y1), connectionstyle=f"arc3,rad={bend}",
                                arrowstyle="-|>", mutation_scale=22, shrinkA=30, shrinkB=30,
                                color="red" if hot else "#555555", lw=3 if hot else 1.5,
                                zorder=2)
        ax.add_patch(arrow)
        # the label beside the arrow's middle, on the side it bends to
        length = math.hypot(dx, dy) or 1.0
        off = bend * length / 2 + math.copysign(0.5, bend)
        ax.text(mx + dy / length * off, my - dx / length * off,
                f"waits for rank {peer}\nin {label}", ha="center", va="center", fontsize=10,
                color="red" if hot else "#333333",
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.85), zorder=5)
    ax.set_xlim(-2.0, 2.0)
    ax.set_ylim(-1.7, 1.7)
    ax.set_aspect("equal")
    ax.axis("off")
    if note is not None:
        pass
    elif cycle:
        ring = " -> ".join(f"rank {r}" for r in cycle + cycle[:1])
        note = f"red: the wait-for cycle {ring}: nobody can move (deadlock)"
    elif edges:
        note = "no cycle: the waits will end"
    else:
        note = "nobody waits"
    ax.set_title(title, fontsize=12)
    fig.text(0.5, 0.03, "an arrow: a rank's collective waits for the other rank (its data, "
             "or room in its buffer)\n" + note, ha="center", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stretches(events: list[dict]) -> list[dict]:
    """Each stretch a block ran a collective, from loaded to preempted or completed, as
    dict(rank, block, coll, start, end, ended); a stretch still open at the end of the
    events has ``ended`` "stuck" and ends at the last event's time."""
    out, running = [], {}
    last = max((e["t_ns"] for e in events), default=0)
    for e in sorted(events, key=lambda e: (e["rank"], e["block"], e["t_ns"])):
        track = (e["rank"], e["block"])
        if e["event"] == "loaded":
            running[track] = e
        elif e["event"] in ("preempted", "completed", "quit") and track in running:
            start = running.pop(track)
            out.append(dict(rank=e["rank"], block=e["block"], coll=start["coll"],
                            start=start["t_ns"], end=e["t_ns"],
                            ended=e["event"] if e["event"] != "quit" else "quit"))
    for (rank, block), start in running.items():
        out.append(dict(rank=rank, block=block, coll=start["coll"], start=start["t_ns"],
                        end=last, ended="stuck"))
    return out


def draw_timeline(events: list[dict], path: str, title: str, names: dict | None = None,
                  note: str | None = None) -> None:
    """The timeline picture of ``events`` (daemon events and host marks of every rank, on
    one clock); ``names`` maps a collective to its label, ``note`` is a line under the
    title (what happened, e.g. the deadlock)."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = names or {}
    if not events:
        fig, ax = plt.subplots(figsize=(8, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "no events were recorded", ha="center", va="center")
        ax.set_title(title)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return
    t0 = min(e["t_ns"] for e in events)
    ms = lambda t: (t - t0) / 1e6          # noqa: E731
    colls = sorted({e["coll"] for e in events if e["coll"] is not None and
                    e["block"] != HOST_TRACK} | set(names), key=str)
    colour = {c: COLLECTIVE_COLOURS[i % len(COLLECTIVE_COLOURS)] for i, c in enumerate(colls)}
    label = lambda c: names.get(c, f"collective {c}")   # noqa: E731
    ranks = sorted({e["rank"] for e in events})
    # lanes, top to bottom per rank: host, blocks, budgets
    lanes, y = {}, 0
    for r in ranks:
        blocks = sorted({e["block"] for e in events if e["rank"] == r and e["block"] >= 0})
        if any(e["rank"] == r and e["block"] == HOST_TRACK for e in events):
            lanes[(r, "host")] = y
            y += 1
        for b in blocks:
            lanes[(r, b)] = y
            y += 1
        lanes[(r, "budget")] = y
        y += 1.3
    fig, ax = plt.subplots(figsize=(12, 0.62 * y + 2.6))
    for s in stretches(events):
        row = lanes[(s["rank"], s["block"])]
        stuck = s["ended"] in ("stuck", "quit")     # left unfinished: the abort
        ax.broken_barh([(ms(s["start"]), max(ms(s["end"]) - ms(s["start"]), 1e-3))],
                       (row - 0.35, 0.7), facecolor=colour.get(s["coll"], "#cccccc"),
                       edgecolor="black" if stuck else "none", hatch="//" if stuck else None)
    budgets: dict = {}
    runs: dict = {}        # (rank, coll) -> its run number: a budget line per run
    for e in sorted(events, key=lambda e: e["t_ns"]):
        if e["block"] == HOST_TRACK:
            continue
        row = lanes[(e["rank"], e["block"])]
        if e["event"] == "completed":
            runs[(e["rank"], e["coll"])] = runs.get((e["rank"], e["coll"]), 0) + 1
        elif e["event"] == "preempted":
            ax.plot(ms(e["t_ns"]), row, marker="X", color="black", ms=8, mec="white", mew=0.6,
                    zorder=4)
            key = (e["rank"], e["coll"], runs.get((e["rank"], e["coll"]), 0))
            budgets.setdefault(key, []).append((ms(e["t_ns"]), e.get("waited_ns", 0) / 1e6))
        elif e["event"] in ("quit", "launched"):
            ax.plot(ms(e["t_ns"]), row + (0.45 if e["event"] == "quit" else -0.45),
                    marker="v" if e["event"] == "quit" else "^", color="#777777", ms=7,
                    zorder=4)
    top = max((b for pts in budgets.values() for _, b in pts), default=0.0)
    for (rank, coll, _run), pts in budgets.items():
        base = lanes[(rank, "budget")]
        xs = [x for x, _ in pts]
        ys = [base + 0.4 - 0.8 * b / (top or 1) for _, b in pts]   # higher budget: higher
        ax.plot(xs, ys, "-o", color=colour.get(coll), ms=4, lw=1.2, drawstyle="steps-post")
    host_marker = {MARK_RUN: ("$\\rightarrow$", -0.22), MARK_SYNCED: ("s", 0.22),
                   MARK_RESULT: ("o", 0.0)}      # marker, offset in the lane
    for e in events:
        if e["block"] != HOST_TRACK:
            continue
        r = e["rank"]
        if e["event"] == MARK_DEADLOCK:
            rows = [v for k, v in lanes.items() if k[0] == r]
            ax.plot([ms(e["t_ns"])] * 2, [min(rows) - 0.5, max(rows) + 0.5], ls="--",
                    color="red", lw=1.5, zorder=1)
            ax.text(ms(e["t_ns"]), max(rows) + 0.45, "deadlock reported ", fontsize=8,
                    color="red", ha="right", va="bottom")
        elif e["event"] == MARK_SUBMITTING:
            rows = [v for k, v in lanes.items() if k[0] == r]
            ax.plot([ms(e["t_ns"])] * 2, [min(rows) - 0.5, max(rows) + 0.5], ls="--",
                    color="#999999", lw=1, zorder=1)
            ax.text(ms(e["t_ns"]), min(rows) - 0.55 - 0.35 * (e["loop"] % 2),
                    f" iteration {e['loop']}", fontsize=8, color="#555555", va="bottom")
        elif e["event"] in host_marker:
            marker, dy = host_marker[e["event"]]
            ax.plot(ms(e["t_ns"]), lanes[(r, "host")] + dy, marker=marker, ms=8,
                    color=colour.get(e["coll"], "#555555") if e["coll"] is not None
                    else "#555555", zorder=4, ls="none")
    budget_lane = (f"budgets (0 to {top:.3g} ms)" if top else "budgets (no preemption)")
    ax.set_yticks(list(lanes.values()),
                  [f"rank {r} host" if k == "host" else f"rank {r} {budget_lane}"
                   if k == "budget" else f"rank {r} GPU block {k}" for r, k in lanes])
    ax.set_ylim(y - 0.6, -1.5)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#eeeeee")
    ax.set_title(title + (f"\n{note}" if note else ""), fontsize=11)
    handles = [Patch(color=colour[c], label=label(c)) for c in colls]
    if budgets:
        handles.append(Line2D([], [], marker="X", color="black", ls="none", ms=8,
                              label="preempted (budget ran out)"))
    if any(s["ended"] in ("stuck", "quit") for s in stretches(events)):
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//",
                             label="never finished (stopped by the abort)"))
    handles += [Line2D([], [], marker="v", color="#777777", ls="none", label="daemon quit"),
                Line2D([], [], marker="^", color="#777777", ls="none",
                       label="daemon launched"),
                Line2D([], [], marker="$\\rightarrow$", color="#555555", ls="none", ms=9,
                       label="host: run() returned"),
                Line2D([], [], marker="s", color="#555555", ls="none",
                       label="host: device sync returned"),
                Line2D([], [], marker="o", color="#555555", ls="none", label="host: result"),
                Line2D([], [], marker="o", color="#555555", ls="-",
                       label="budget of each preemption (colour: collective)")]
    ax.legend(handles=handles, fontsize=8, ncol=4, loc="upper center",
              bbox_to_anchor=(0.5, -0.12), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
