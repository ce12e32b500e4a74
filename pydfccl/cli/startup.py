"""``python -m pydfccl bench startup``: how long a fresh process takes to its first verified
collective, cold (an empty kernel cache) and warm (the cache the cold run filled).

Each run is a new interpreter (``startup_probe.PROBE``): a 2-rank program that imports pydfccl,
loads the runtime while the CUDA driver and context start beside it, as ``launch`` does
(``cuda_start``), compiles or loads the daemon, launches its ranks, prepares and starts one
all-reduce and checks its first result. The phases are timed inside the process; from
outside, the time from starting the process to its verified result (the figure start-up is
judged by), the whole process's time with its exit, and a bare ``python -c pass`` as the
run's own baseline.
Under the simulator the compile phase is what the simulator does (its kernels are Python).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ..cuda_env import WORK_QUEUES
from ..sched.policies import policy_names
from .exits import CommandError, UsageError
from .startup_probe import CONTEXT_PROBE, PROBE

__all__ = ["measure", "context_alone", "main"]

BASELINE = "python -c pass (baseline)"
TO_RESULT = "process start to the verified result"
WHOLE = "whole process, with its exit"


def _wall(cmd: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    return time.perf_counter() - t, proc


def measure(cache_dir: str, policy: str, count: int, numba_dir: str | None = None) -> dict:
    """One fresh process's phases (seconds) with ``cache_dir`` as its kernel cache (and
    ``numba_dir``, default the same, as Numba's for what it compiles for the CPU)."""
    env = dict(os.environ, PYDFCCL_CACHE_DIR=cache_dir, NUMBA_CACHE_DIR=numba_dir or cache_dir)
    spawned = time.time()       # the probe reports its result's time on the same clock
    wall, proc = _wall([sys.executable, "-c", PROBE, policy, str(count)], env)
    if proc.returncode != 0:
        raise CommandError(f"the start-up probe failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if not report["ok"]:
        raise CommandError("the start-up probe's first all-reduce gave a wrong result")
    report["phases"][TO_RESULT] = report.pop("verified_at") - spawned
    report["phases"][WHOLE] = wall
    return report


def context_alone(env: dict) -> float | None:
    """Seconds from starting a bare process to the GPU's context made in it (with ``env``'s
    work queues), or None where there is no CUDA driver: the floor under any start-up."""
    spawned = time.time()
    proc = subprocess.run([sys.executable, "-c", CONTEXT_PROBE], env=env, capture_output=True,
                          text=True, timeout=300)
    made = json.loads(proc.stdout.strip() or "null") if proc.returncode == 0 else None
    return None if made is None else made - spawned


def _byte_code_note(uncompiled: dict[str, int]) -> str:
    """A line naming the packages a warm process compiled from source, if any."""
    if not uncompiled:
        return ""
    ranked = sorted(uncompiled.items(), key=lambda kv: -kv[1])
    named = ", ".join(f"{top} {n}" for top, n in ranked[:5])
    if len(ranked) > 5:
        named += f", {sum(n for _, n in ranked[5:])} in {len(ranked) - 5} more"
    return (f"Byte code: {sum(uncompiled.values())} imported modules had none cached, so "
            f"each process compiled them from source ({named}): `python -m compileall` "
            "on their directories, as pip's install does, takes that off every start.")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl bench startup", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", default="dfccl", choices=policy_names())
    p.add_argument("--count", type=int, default=1024, help="elements of the all-reduce")
    p.add_argument("--warm", type=int, default=2, metavar="N",
                   help="warm runs; the table shows each phase's median (default 2)")
    p.add_argument("--prebuilt", metavar="DIR",
                   help="a third column: a fresh process whose kernel cache is DIR, as "
                        "'build-kernels' filled it (PYDFCCL_CACHE_DIR=DIR), nothing else cached")
    p.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.warm < 1 or args.count < 1:
        raise UsageError("--warm and --count must be at least 1")
    if args.prebuilt and not os.path.isdir(args.prebuilt):
        raise UsageError(f"--prebuilt {args.prebuilt}: no such directory")
    env = dict(os.environ)
    baseline = min(_wall([sys.executable, "-c", "pass"], env)[0] for _ in range(3))
    with tempfile.TemporaryDirectory(prefix="pydfccl-kernels-") as cache:
        print(f"start-up to the first verified all_reduce of 2 ranks ({args.policy}), each "
              f"run a fresh process; cold: an empty kernel cache", flush=True)
        cold = measure(cache, args.policy, args.count)
        warm = [measure(cache, args.policy, args.count) for _ in range(args.warm)]
    prebuilt = None
    if args.prebuilt:
        with tempfile.TemporaryDirectory(prefix="pydfccl-numba-") as numba_dir:
            prebuilt = measure(os.path.abspath(args.prebuilt), args.policy, args.count,
                               numba_dir)
    names = list(cold["phases"])
    columns = [("cold (s)", {n: cold["phases"][n] for n in names}),
               ("warm (s)", {n: statistics.median(w["phases"][n] for w in warm)
                             for n in names})]
    if prebuilt:
        columns.append(("prebuilt (s)", prebuilt["phases"]))
    print(f"backend: {cold['backend']}")
    print(f"{'phase':<40}" + "".join(f" {title:>12}" for title, _ in columns))
    print(f"{BASELINE:<40}" + "".join(f" {baseline:>12.3f}" for _ in columns))
    for name in names:
        print(f"{name:<40}" + "".join(f" {values[name]:>12.3f}" for _, values in columns))
    beside = [r.get("context_beside_imports") for r in [cold] + warm]
    if all(b is not None for b in beside):
        print(f"The CUDA driver and context, started in a thread beside the runtime's imports, "
              f"took {beside[0]:.3f} s cold, {statistics.median(beside[1:]):.3f} s warm.")
    floor = context_alone(env)
    if floor is not None:
        print(f"A bare process that only starts the driver and makes the context "
              f"({WORK_QUEUES}={env.get(WORK_QUEUES, 'unset')}) has it after {floor:.3f} s: "
              f"the floor under the start-up above.")
    note = _byte_code_note(warm[-1].get("uncompiled", {}))
    if note:
        print(note)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(backend=cold["backend"], policy=args.policy, baseline=baseline,
                           cold=cold["phases"], warm=[w["phases"] for w in warm],
                           prebuilt=prebuilt and prebuilt["phases"],
                           uncompiled=warm[-1].get("uncompiled", {}),
                           context_alone=floor), f, indent=1)
    return 0
