"""Probe (GPU): where a run's start-up time goes, and whether the daemons come from the disk cache.

Prints the seconds taken by importing pydfccl, creating the CUDA context, compiling (or
loading) each policy's daemon, with Numba's cache hits and misses, each daemon's registers
and local memory per thread, and a first 2-rank all-reduce. Run it twice: the second run
should show only cache hits. Run: python3 scripts/probe_startup.py
"""
import time

t0 = time.perf_counter()

import pydfccl                                                # noqa: E402
from pydfccl.kernels.daemon import compile_now, make_daemon   # noqa: E402
from pydfccl.sched.policies import get_policy, policy_names   # noqa: E402


def first_value(per_signature: dict):
    return next(iter(per_signature.values()))


def lap(what, since):
    now = time.perf_counter()
    print(f"{what:<34} {now - since:7.2f} s")
    return now


def main():
    t = lap("import pydfccl", t0)
    from numba import cuda
    cuda.current_context()
    t = lap("CUDA context", t)
    for name in policy_names():
        kernel = make_daemon(get_policy(name))
        compile_now(kernel)
        stats = kernel.stats
        t = lap(f"daemon {name}", t)
        print(f"    cache hits {sum(stats.cache_hits.values())}, misses "
              f"{sum(stats.cache_misses.values())}; registers "
              f"{first_value(kernel.get_regs_per_thread())}, local bytes "
              f"{first_value(kernel.get_local_mem_per_thread())} per thread")

    def first(comm):
        comm.prepare(0, "all_reduce", count=1024)
        comm.start()
        x = comm.empty(1024, "float32")
        comm.run(0, x).result(timeout=60)
        return True

    assert all(pydfccl.launch(first, nranks=2))
    lap("launch 2 ranks + first all_reduce", t)
    lap("total", t0)


if __name__ == "__main__":
    main()
