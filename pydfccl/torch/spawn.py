"""Start one process per rank the way torchrun does (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT in the environment), for examples and tests that start their own
ranks. Separate interpreters, not multiprocessing children: nothing (resource tracker,
CUDA state) is shared between ranks, as under torchrun."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

from ..bootstrap.store import free_port

__all__ = ["free_port", "spawn_ranks", "run_as_ranks"]


def spawn_ranks(argv: list[str], nranks: int, *, timeout: float | None = None,
                env: dict | None = None, capture: bool = False) -> list:
    """Run ``python argv...`` once per rank; returns each rank's CompletedProcess-like
    (returncode, stdout, stderr). When a rank fails the others get 30 s to finish before
    they are killed; past ``timeout`` every rank is killed (returncode -9)."""
    port = free_port()
    # the job's own secret and id for pydfccl's store (bootstrap/store.py): only these
    # processes can drive it, and a job on a reused port is not taken for this one
    job = dict(PYDFCCL_SECRET=secrets.token_hex(32), PYDFCCL_JOB_ID=f"spawn-{secrets.token_hex(8)}")
    procs = []
    for rank in range(nranks):
        rank_env = dict(os.environ, **job, **(env or {}), RANK=str(rank), WORLD_SIZE=str(nranks),
                        LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nranks),
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = subprocess.PIPE if capture else None
        procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, stdout=out,
                                      stderr=out, text=True))
    deadline = None if timeout is None else time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
            failed_at = now
        if (deadline is not None and now > deadline) or (failed_at and now - failed_at > 30):
            for p in procs:
                if p.poll() is None:
                    p.kill()
            break
        time.sleep(0.05)
    results = []
    for p in procs:
        stdout, stderr = p.communicate()
        results.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return results


def run_as_ranks(script: str, argv: list[str] | None, nranks: int, rank_main,
                 timeout: float | None = None) -> int:
    """An example's ``main``: inside a rank (RANK set, as torchrun sets it) run
    ``rank_main()``; otherwise start ``nranks`` ranks of ``script`` with the same arguments
    and return the exit status that matters (0 when every rank exited 0)."""
    if "RANK" in os.environ:
        return rank_main()
    args = list(sys.argv[1:] if argv is None else argv)
    results = spawn_ranks([os.path.abspath(script), *args], nranks, timeout=timeout)
    codes = [r.returncode for r in results]
    if any(codes):
        print(f"ranks exited with {codes}", file=sys.stderr)
    return max(codes, key=abs) if any(codes) else 0
