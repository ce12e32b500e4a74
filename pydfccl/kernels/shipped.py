"""Daemons shipped with the package as cubins, so that a fresh machine compiles nothing.

Compiling a daemon (Numba's front end, libNVVM, nvJitLink) takes 25-35 s, and a fresh
machine, a new virtualenv or a notebook's first cell pays it before its first collective.
The machine code depends only on the kernels' sources, the policy and the register cap
(``compiler.cache_key``) and on the GPU's architecture, not on the Python or Numba version
that built it, so ``python -m pydfccl build-kernels --ship`` writes the cubins of the
default daemons into ``kernels/shipped/`` with a manifest of their keys, and the runtime
loads one through the driver (``platform.cubin``) when its key and the GPU's compute
capability match. Any other daemon (another policy or width, a changed source, another
GPU) is compiled and cached as before. A test fails when a shipped key no longer matches
the sources, naming the command that rebuilds them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["SHIPPED_DIR", "ShippedDaemon", "shipped_daemons", "find_shipped", "ship"]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class ShippedDaemon:
    """One shipped cubin: what it was built from and for, and its kernel's name."""

    policy: str
    nthreads: int
    registers: int
    cc: tuple[int, int]
    key: str            # compiler.cache_key at build time
    entry: str          # the kernel's (mangled) name in the cubin
    nargs: int          # its int64 arguments
    file: str           # beside the manifest

    def image(self, directory: Path = SHIPPED_DIR) -> bytes:
        return (directory / self.file).read_bytes()


def shipped_daemons(directory: Path = SHIPPED_DIR) -> list[ShippedDaemon]:
    """Every entry of the manifest (none where there is none)."""
    path = directory / _MANIFEST
    if not path.exists():
        return []
    return [ShippedDaemon(**dict(entry, cc=tuple(entry["cc"])))
            for entry in json.loads(path.read_text())]


def find_shipped(policy, registers: int, cc: tuple[int, int],
                 directory: Path = SHIPPED_DIR) -> ShippedDaemon | None:
    """The shipped daemon of ``policy`` with ``registers`` a thread for a GPU of compute
    capability ``cc``, if its key matches today's sources."""
    from .compiler import cache_key

    candidates = [d for d in shipped_daemons(directory)
                  if d.policy == policy.name and d.registers == registers
                  and d.cc == tuple(cc)]
    if not candidates:
        return None
    key = cache_key(policy, registers)
    return next((d for d in candidates if d.key == key), None)


def ship(daemon: ShippedDaemon, image: bytes, directory: Path = SHIPPED_DIR) -> None:
    """Write ``image`` as ``daemon.file`` and put ``daemon`` in the manifest, replacing an
    entry of the same policy, width and capability."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / daemon.file).write_bytes(image)
    kept = [d for d in shipped_daemons(directory)
            if (d.policy, d.nthreads, d.cc) != (daemon.policy, daemon.nthreads, daemon.cc)]
    entries = sorted(kept + [daemon], key=lambda d: (d.policy, d.nthreads, d.cc))
    (directory / _MANIFEST).write_text(
        json.dumps([asdict(d) for d in entries], indent=1) + "\n")
