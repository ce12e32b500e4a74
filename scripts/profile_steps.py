"""Where a daemon step's time goes, phase by phase (``kernels/step_profile.py``).

Builds the daemon with PYDFCCL_PROFILE_STEPS=1, runs steps, lets the daemon quit (a block
adds its phase counters to the pool when it exits) and prints each phase's cycles and
nanoseconds per step, and the cycles a rank spends per run taking it from the SQ
(``sq``, ``absorb``), loading its context (``load``) and retiring it, for three workloads on one
block a rank:

- ``copy``: one rank, 16-byte slots, 16 KiB all-reduces: 1,024 steps a run that wait for
  nothing;
- ``ring``: two ranks, the ring (one-shot off), 16-byte slots: 3 steps a loop, each
  waiting for the peer;
- ``one_shot``: two ranks, 8-byte all-reduces, two steps a run (the latency benchmark's).

The marks cost cycles of their own (a clock read and a shared-memory add each, seven a step),
so the total is a little above the plain daemon's step. On the simulator the cycles are
nanoseconds of the host. Run:
python3 scripts/profile_steps.py [--nthreads 256 512] [--runs 50]
"""
import argparse
import os
import time

os.environ["PYDFCCL_PROFILE_STEPS"] = "1"

import numpy as np                                         # noqa: E402

import pydfccl                                             # noqa: E402
from pydfccl.protocol import layout as L                            # noqa: E402
from pydfccl.protocol import one_shot as one_shot_rule     # noqa: E402
from pydfccl.kernels.step_profile import (PH_PLAN, PH_RETIRE, PH_SQ,  # noqa: E402
                                          PH_STEPS, PHASES, PROFILE_WORDS)

STEP_PHASES = PHASES[PH_PLAN:]               # a step's, in order
RUN_PHASES = PHASES[PH_SQ:PH_RETIRE + 1]      # a run's: sq, absorb, load, retire

WORKLOADS = {   # name: (ranks, slot bytes, elements per run, one-shot limit)
    "copy": (1, 16, 4096, one_shot_rule.ONE_SHOT_BYTES),
    "ring": (2, 16, 4096, 0),
    "one_shot": (2, None, 2, one_shot_rule.ONE_SHOT_BYTES),
}


def worker(comm, runs: int, count: int):
    comm.prepare(0, "all_reduce", count=count, dtype="float32")
    comm.start()
    x = comm.empty(count, "float32")
    y = comm.empty(count, "float32")
    for _ in range(runs):
        comm.run(0, x, y).result(timeout=60)
    deadline = time.monotonic() + 20     # the daemon quits once idle and adds its counters
    while time.monotonic() < deadline:
        s = comm.stats()
        if s["quits"] >= s["launches"]:
            break
        time.sleep(0.01)
    raw = comm.world.pools[comm.rank].read(L.P_STEP_PHASES, PROFILE_WORDS * 8).view(np.int64)
    return raw[:PH_STEPS + 1].copy(), comm.stats()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nthreads", type=int, nargs="+", default=[256, 512])
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    from numba import cuda
    # the boost clock, kHz -> GHz (the simulator counts nanoseconds for cycles)
    ghz = getattr(cuda.get_current_device(), "CLOCK_RATE", 1e6) / 1e6
    print(f"thread 0's cycles per step by phase; ns at {ghz:.2f} GHz; {args.runs} runs each")
    header = "".join(f"{name:>12}" for name in STEP_PHASES + ("step", "ns/step")
                     + tuple(f"{name}/run" for name in RUN_PHASES))
    for nthreads in args.nthreads:
        print(f"\nblocks of {nthreads} threads\n{'workload':<10}{'steps':>8}{header}")
        for name, (nranks, slot_bytes, count, one_shot) in WORKLOADS.items():
            one_shot_rule.ONE_SHOT_BYTES = one_shot   # the ranks are threads of this process
            sizes = dict(nblocks=1, nthreads=nthreads)
            if slot_bytes:
                sizes["slot_bytes"] = slot_bytes
            per_rank = pydfccl.launch(worker, nranks, args=(args.runs, count), **sizes)
            counts = sum(cycles for cycles, _ in per_rank)
            steps = max(1, int(counts[PH_STEPS]))
            phases = counts[PH_PLAN:PH_STEPS] / steps
            step = phases.sum()
            per_run = counts[PH_SQ:PH_RETIRE + 1] / (args.runs * nranks)
            cells = "".join(f"{c:>12,.0f}" for c in (*phases, step, step / ghz, *per_run))
            print(f"{name:<10}{steps:>8,}{cells}", flush=True)


if __name__ == "__main__":
    main()
