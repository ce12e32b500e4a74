"""``python -m pydfccl risk``: the study's command line, a thin parser over
:func:`~pydfccl.sched.risk_estimate.risk_study` and its table."""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

from .risk_estimate import RiskRow, plot, risk_study, write_csv
from .risk_example import explain_round, find_example
from .risk_rounds import PRESETS, Topology

__all__ = ["main"]

_PAPER = {(0.001, 0.001): "paper: 2.8% of rounds (GPT-3, 3072 GPUs)"}


def _floats(text: str) -> List[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")
    if not values or any(not 0 <= v <= 1 for v in values):
        raise argparse.ArgumentTypeError(f"probabilities must lie in [0, 1]: {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m pydfccl risk",
        description="Estimate how often NCCL-style training deadlocks when each submission "
                    "is deferred with probability p and preceded by a GPU sync with "
                    "probability q (the DFCCL paper's risk study).")
    ap.add_argument("--preset", choices=sorted(PRESETS), default="small",
                    help="topology, grid and rounds to start from (default: small)")
    for name, help_ in (("tp", "tensor-parallel group size"), ("dp", "data-parallel group size"),
                        ("pp", "pipeline stages"),
                        ("colls-tp", "collectives per TP group per iteration"),
                        ("colls-dp", "collectives per DP group per iteration"),
                        ("colls-pp", "point-to-point transfers per pipeline link per iteration")):
        ap.add_argument(f"--{name}", type=int, help=help_ + " (default: the preset's)")
    ap.add_argument("--p", type=_floats, help="disorder probabilities, e.g. 0.001,0.01")
    ap.add_argument("--q", type=_floats, help="sync probabilities, e.g. 0.001,0.01")
    ap.add_argument("--rounds", type=int, help="rounds (iterations) per grid point")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--workers", type=int, default=1,
                    help=f"processes (default 1; this machine has {os.cpu_count()} CPUs)")
    ap.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    ap.add_argument("--plot", metavar="FILE.png", help="also plot P(deadlock) against p")
    ap.add_argument("--progress", action="store_true", help="show a progress bar on stderr")
    ap.add_argument("--skip-span", type=int, default=1, metavar="N",
                    help="submissions a deferral moves its collective past: 1 (default) the "
                         "next one; N > 1 the paper's skip of several positions")
    ap.add_argument("--example", action="store_true",
                    help="instead of the table: the first deadlocked round drawn (at the "
                         "largest p and q given), told as a cycle")
    return ap


def _table(topo: Topology, rows: List[RiskRow]) -> str:
    head = (f"{topo.ngpus} GPUs = TP {topo.tp} x DP {topo.dp} x PP {topo.pp}; "
            f"{topo.colls_tp} collectives per TP group, {topo.colls_dp} per DP group"
            + (f", {topo.colls_pp} per pipeline link" if topo.colls_pp and topo.pp > 1 else "")
            + f"; {topo.nslots} submissions per GPU per round")
    lines = [head, f"{'p':>10} {'q':>10} {'rounds':>7} {'deadlocks':>9} {'P(deadlock)':>11}  "
                   f"{'95% CI (Wilson)':<19}"]
    for row in rows:
        lo, hi = row.interval
        note = _PAPER.get((row.p, row.q), "") if topo == PRESETS["gpt3"]["topology"] else ""
        lines.append(f"{row.p:>10g} {row.q:>10g} {row.rounds:>7} {row.deadlocks:>9} "
                     f"{row.probability:>10.2%}  [{lo:7.2%}, {hi:7.2%}]  {note}".rstrip())
    return "\n".join(lines)


def _example(topo: Topology, p: float, q: float, seed: int, skip_span: int) -> int:
    span = "one submission" if skip_span == 1 else f"{skip_span} submissions"
    print(f"{topo.ngpus} GPUs = TP {topo.tp} x DP {topo.dp} x PP {topo.pp}, "
          f"{topo.nslots} submissions per GPU; p = {p:g} (a deferral moves a collective past "
          f"{span}), q = {q:g}, seed {seed}")
    found = find_example(topo, p, q, seed, skip_span)
    if found is None:
        print("no deadlocked round in 100000 rounds: raise --p or --q", file=sys.stderr)
        return 1
    n, rnd, cycle = found
    print(f"round {n} deadlocks:")
    print(explain_round(topo, rnd, cycle))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    preset = PRESETS[args.preset]
    base = preset["topology"]
    pick = lambda value, default: default if value is None else value
    try:
        topo = Topology(pick(args.tp, base.tp), pick(args.dp, base.dp), pick(args.pp, base.pp),
                        pick(args.colls_tp, base.colls_tp), pick(args.colls_dp, base.colls_dp),
                        pick(args.colls_pp, base.colls_pp))
    except ValueError as exc:
        print(f"risk: {exc}", file=sys.stderr)
        return 2
    rounds = pick(args.rounds, preset["rounds"])
    if rounds < 1 or args.workers < 1 or args.skip_span < 1:
        print("risk: --rounds, --workers and --skip-span must be >= 1", file=sys.stderr)
        return 2
    ps, qs = pick(args.p, preset["p"]), pick(args.q, preset["q"])
    if args.example:
        return _example(topo, max(ps), max(qs), args.seed, args.skip_span)
    rows = risk_study(topo, ps, qs, rounds, seed=args.seed, workers=args.workers,
                      progress=args.progress, skip_span=args.skip_span)
    print(_table(topo, rows))
    if args.csv:
        write_csv(args.csv, topo, rows)
    if args.plot:
        plot(args.plot, topo, rows)
    return 0
