"""The torch rows of the fault table (docs/troubleshooting.md), through torch.distributed as
a user calls it, with a process per rank as torchrun starts them: a rank late to
``barrier()`` is waited for, and a failed all-reduce stops the program. On a GPU the tensors
are CUDA tensors (the GPU batch's rows); on the simulator, CPU tensors."""

import json
import os
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from pydfccl import platform  # noqa: E402
from pydfccl.torch.spawn import spawn_ranks  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
GPU = platform.gpu_available()


def _ranks(script: Path, args: list[str], nranks: int, timeout: float,
           silent=()) -> list[dict]:
    """Every rank's ``RESULT`` line (but the ``silent`` ranks'), with how long the job
    took (``took``)."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    t0 = time.monotonic()
    results = spawn_ranks([str(script), *args], nranks, timeout=timeout, env=env,
                          capture=True)
    took = time.monotonic() - t0
    out = []
    for rank, r in enumerate(results):
        if rank in silent:
            out.append(None)
            continue
        lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        assert lines, f"rank {rank} ({r.returncode}):\n{r.stderr[-6000:]}"
        out.append(dict(json.loads(lines[-1][len("RESULT "):]), returncode=r.returncode,
                        took=took))
    return out


# 25 s is past the GPU's stall watchdog (20 s), where a late torch rank was once declared
# dead; 60 s is the GPU batch's row (its daemons quit and relaunch while they wait).
LATE = [25.0, pytest.param(60.0, marks=pytest.mark.skipif(
    not GPU, reason="the GPU batch's row; the simulator runs the 25 s one"))]


@pytest.mark.parametrize("late", LATE, ids=lambda s: f"{s:.0f}s")
def test_a_rank_late_to_barrier_is_waited_for(late):
    out = _ranks(HERE / "late_rank.py", [str(late)], 3, timeout=late + 400)
    for rank, o in enumerate(out):
        assert o["returncode"] == 0, (rank, o)
        assert o["values"] == [6.0], (rank, o)
        assert o["device"] == ("cuda" if GPU else "cpu")
    for rank in (0, 2):
        assert out[rank]["waited"] > late - 5, out      # they did wait for rank 1
    print(f"\nlate {late:.0f} s: the barrier returned {out[0]['waited']:.1f} s after rank 0 "
          f"entered it; job {out[0]['took']:.0f} s")


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_failed_all_reduce_stops_the_program(form):
    """Rank 1's process ends while its peers are in an all-reduce: the call (or its
    ``wait()``) raises naming rank 1, so the line after it, a kernel reading the tensor,
    never runs; the group's next collective raises the first error."""
    if form == "async" and not GPU:
        pytest.skip("tests/ranks/test_faults.py runs it on CPU tensors")
    device = "cuda" if GPU else "cpu"
    out = _ranks(ROOT / "tests" / "ranks" / "torch_failure_rank.py", [device, form], 3,
                 timeout=400, silent=(1,))
    for rank in (0, 2):
        seen = out[rank]
        assert re.search(r"rank failure: rank 1: its process \(pid \d+\) ended without "
                         "closing its communicator", seen["first"]), seen
        assert "after" not in seen, seen               # nothing read the unreduced tensor
        assert "an earlier collective of this group failed (rank failure: rank 1" in \
            seen["later"], seen
    print(f"\n{device} {form}: the job ended {out[0]['took']:.0f} s after it began (rank 1 "
          "leaves 3 s after the group is up)")
