"""Registers, spills and stack of each policy's daemon for sm_90, without a GPU.

The daemon's speed depends on what ptxas makes of it: a change that adds spills or stack
slows every step. This compiles each daemon to PTX with libNVVM (as CI does), assembles it
with the ptxas on PATH under the register cap the runtime uses, and prints one line per
policy, so that a change to the kernels can be compared with the tree before it:

    python scripts/ptx_resources.py            # every registered policy
    python scripts/ptx_resources.py dfccl      # one

An older ptxas may not accept the PTX version libNVVM writes; the ``.version`` line is then
lowered to the one ptxas names in its error (the daemon uses no newer PTX feature).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

REGISTER_CAP = 128        # the runtime's cap for the daemon's default block width
RESOURCES = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                       r"loads.*?Used (\d+) registers", re.S)
PTX_VERSION = re.compile(r"Unsupported \.version [\d.]+; current version is '([\d.]+)'")


def assemble(ptx: str) -> str:
    """ptxas's verbose report for ``ptx``, lowering the PTX version once if it must."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "daemon.ptx")
        for _ in range(2):
            with open(path, "w") as f:
                f.write(ptx)
            proc = subprocess.run(["ptxas", "-arch=sm_90", "-v", "--maxrregcount",
                                   str(REGISTER_CAP), path, "-o", os.devnull],
                                  capture_output=True, text=True)
            lower = PTX_VERSION.search(proc.stderr)
            if proc.returncode == 0 or not lower:
                break
            ptx = re.sub(r"^\.version [\d.]+", f".version {lower.group(1)}", ptx, flags=re.M)
        if proc.returncode != 0:
            raise SystemExit(f"ptxas failed: {proc.stderr.strip()}")
        return proc.stderr


def main(argv: list[str]) -> int:
    if shutil.which("ptxas") is None:
        print("ptx_resources: no ptxas on PATH (it comes with the CUDA toolkit)")
        return 2
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"    # Numba's CUDA target, even without a driver
    os.environ.setdefault("NUMBA_FORCE_CUDA_CC", "9.0")
    from pydfccl.kernels.ptx import daemon_ptx
    from pydfccl.sched.policies import policy_names

    print(f"{'policy':<10} {'registers':>9} {'stack':>6} {'spill stores':>13} "
          f"{'spill loads':>12}   (sm_90, cap {REGISTER_CAP}, bytes)")
    for name in argv or policy_names():
        found = RESOURCES.search(assemble(daemon_ptx(name)))
        stack, stores, loads, registers = (int(g) for g in found.groups())
        print(f"{name:<10} {registers:>9} {stack:>6} {stores:>13} {loads:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
