"""``python -m pydfccl build-kernels``: compile daemons ahead, on the CPU, into the kernel
cache that the runtime reads, so that the first run on a GPU machine loads them instead of
compiling (libNVVM and nvJitLink need no GPU). One daemon per policy and block width; a
program compiles only the ones it starts."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from ..kernels.limits import MAX_THREADS
from ..sched.policies import policy_names
from .exits import UsageError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pydfccl build-kernels", description=__doc__)
    p.add_argument("--policy", action="append", choices=policy_names(),
                   help="a policy whose daemon to build (repeatable; default: dfccl)")
    p.add_argument("--all-policies", action="store_true", help="every registered policy")
    p.add_argument("--nthreads", action="append", type=int,
                   help=f"a block width the program launches (repeatable; default: "
                        f"{MAX_THREADS}, the GPU default)")
    p.add_argument("--cc", default="9.0",
                   help="the GPU's compute capability, MAJOR.MINOR (default: 9.0, H100/H200)")
    p.add_argument("--ship", action="store_true",
                   help="also write the cubins into the package's kernels/shipped/, which "
                        "every install then loads without compiling (for the package's "
                        "own default daemons, after a change to the kernels)")
    return p


def _cc(text: str) -> tuple[int, int]:
    try:
        major, minor = (int(part) for part in text.split("."))
    except ValueError:
        raise UsageError(f"--cc {text!r}: expected MAJOR.MINOR, e.g. 9.0") from None
    if major < 7:
        raise UsageError(f"--cc {text}: pydfccl needs compute capability 7.0 or newer")
    return major, minor


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    cc = _cc(args.cc)
    widths = args.nthreads or [MAX_THREADS]
    for n in widths:
        if not 1 <= n <= MAX_THREADS:
            raise UsageError(f"--nthreads {n}: must be in 1..{MAX_THREADS}")
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        # The simulator's kernels are Python: build in a process with Numba's CUDA target
        # (0 says so; without the variable a machine with no driver picks the simulator).
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
        return subprocess.call([sys.executable, "-m", "pydfccl", "build-kernels", *argv],
                               env=env)
    from ..kernels.ahead import build_daemon
    from ..kernels.cache_place import cache_dir
    from ..platform.cubin_resources import kernel_resources

    policies = policy_names() if args.all_policies else (args.policy or ["dfccl"])
    print(f"building {len(policies) * len(widths)} daemon(s) for sm_{cc[0]}{cc[1]} into "
          f"{cache_dir()}", flush=True)
    for name in policies:
        for n in widths:
            built = build_daemon(name, n, cc)
            used = kernel_resources(built.image, built.entry)
            print(f"  {built.policy:<10} nthreads {built.nthreads:<4} registers "
                  f"{used.registers:<3} (cap {built.registers:<3}) stack frame "
                  f"{used.frame_bytes:>4} bytes  cubin {built.cubin_bytes:>8} bytes  "
                  f"{built.seconds:6.1f} s", flush=True)
            if args.ship:
                _ship(built, cc)
    return 0


def _ship(built, cc: tuple[int, int]) -> None:
    from ..kernels.shipped import SHIPPED_DIR, ShippedDaemon, ship

    daemon = ShippedDaemon(built.policy, built.nthreads, built.registers, cc, built.key,
                           built.entry, built.nargs,
                           f"{built.policy}-t{built.nthreads}-sm{cc[0]}{cc[1]}.cubin")
    ship(daemon, built.image)
    print(f"    shipped as {SHIPPED_DIR / daemon.file}", flush=True)
