"""torch.distributed on the "dfccl" backend as a torch user writes it: plain
``torch.distributed`` calls after ``import pydfccl.torch``, ranks started by ``torchrun``
or ``torch.multiprocessing.spawn`` (CPU tensors on the simulator here; CUDA tensors on a
GPU). The programs are tests/torch/api_workers.py and spawn_worker.py."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from pydfccl.errors import PydfcclError  # noqa: E402
from pydfccl.torch import DfcclError, DfcclTimeoutError  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def user_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def torchrun(case, nranks, timeout=240, **env):
    """``torchrun --standalone --nproc-per-node N api_workers.py CASE``: each rank's RESULT."""
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("no torchrun beside this Python")
    done = subprocess.run([exe, "--standalone", "--nproc-per-node", str(nranks),
                           str(HERE / "api_workers.py"), case], env=user_env(**env),
                          capture_output=True, text=True, timeout=timeout)
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert done.returncode == 0 and len(results) == nranks, \
        done.stdout[-3000:] + done.stderr[-6000:]
    return results


def check_calls(results, size):
    by_rank = {int(out["scatter"][0]) - 10: out for out in results}   # rank r got 10 + r
    assert sorted(by_rank) == list(range(size))
    for rank, out in by_rank.items():
        assert out["name"] == "0" and out["backend"] == "dfccl"
        assert out["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
        # where torch builds object collectives' tensors: the CPU, or the GPU where the
        # group has one (either must work: the objects below are checked)
        assert out["object_device"].split(":")[0] in ("cpu", out["device"])
        assert out["funcol"] == [size * (size + 1) / 2] * 3
        assert out["funcol_reduce_scatter"] == [size * (2 * rank + k) + size * (size - 1) / 2
                                                for k in range(2)]
        assert out["objects"] == [{"rank": r, "pad": "x" * r} for r in range(size)]
        assert out["broadcast_objects"] == [1, "from rank"]
        assert out["gather"] == ([[float(r)] * 2 for r in range(size)] if rank == 0 else None)
        assert out["all_to_all"] == [[10.0 * src + rank] * (rank + 1) for src in range(size)]
        assert out["reduce_scatter"] == [float(size * rank + size * (size - 1) / 2)] * 2
        expect = []
        for src in range(size):          # rank src's rows for this rank, of 2 elements
            start = sum(src + p for p in range(rank))
            expect += [100.0 * src + 2 * start + i for i in range(2 * (src + rank))]
        assert out["all_to_allv"] == expect
        assert out["empty_ok"]
        assert out["coalesced"] == [[size * (size - 1) / 2] * 2, [size * (size + 1) / 2] * 3]
        n = 4 * size
        assert out["dtensor_sum"] == n * (n - 1) / 2
        assert out["dtensor_replicated"] == [[4.0 * r + c for c in range(4)] for r in range(size)]
        fsdp, reference = out["fsdp2"]
        assert abs(fsdp - reference) < 1e-5, out["fsdp2"]
        assert out["any_source"].startswith("NotImplementedError: the dfccl backend lacks "
                                            "recv from any source")


def test_every_torch_call_on_a_dfccl_group():
    """Functional collectives, object collectives, gather/scatter, the list forms, uneven
    all_to_all_single, numel-0 no-ops, coalesced all-reduce, DTensor, an FSDP2 step; on 3
    ranks here, on 2 under the debug wrapper below."""
    check_calls(torchrun("calls", 3), 3)


def test_nothing_breaks_under_torch_distributed_debug_detail():
    check_calls(torchrun("calls", 2, TORCH_DISTRIBUTED_DEBUG="DETAIL"), 2)


@pytest.fixture(scope="module")
def reinit_then_mixed():
    """One torchrun job: a group destroyed and made again, then one on a mixed backend
    string (each its own init and destroy)."""
    return torchrun("reinit,mixed", 2)


def test_a_mixed_backend_string_keeps_gloo_for_the_cpu(reinit_then_mixed):
    for out in reinit_then_mixed:
        assert out["mixed"] == {"cpu": "gloo", "cuda": "dfccl", "all_reduce": [3.0, 3.0]}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="device_id must be a GPU")
def test_init_with_device_id_binds_the_group_to_the_gpu():
    for out in torchrun("device_id", 2):
        assert out["bound"] == out["device"] and out["backend"] == "dfccl"
        assert out["all_reduce"] == [3.0, 3.0]


def test_destroy_then_init_again_in_one_process(reinit_then_mixed):
    for out in reinit_then_mixed:
        assert out["reinit"]["sums"] == [[3.0, 3.0], [5.0, 5.0]]


def test_the_group_timeout_bounds_waits_and_errors_are_torch_errors():
    out = sorted(torchrun("timeouts", 2, timeout=300), key=lambda o: "short_wait" not in o)
    for o in out:
        assert o["late_within_timeout"] == [2.0, 2.0]          # 3 s late, timeout 8 s
        assert o["after_short_wait"] == "completed"
        assert o["late_past_timeout"].startswith(("DfcclError: dfccl rank ",
                                                  "DfcclTimeoutError: dfccl rank "))
        assert o["is_pydfccl_error"]
    assert out[0]["short_wait"] == ("DfcclTimeoutError: dfccl rank 0: all_reduce did not "
                                    "complete within 0.5 s (the wait's timeout)")
    assert "dfccl rank 0: " in out[0]["late_past_timeout"]
    assert 6 < out[0]["waited"] < 40, out[0]


def test_multiprocessing_spawn_without_rank_variables_on_this_machine():
    """``torch.multiprocessing.spawn`` with ``init_process_group(rank=, world_size=)``; no
    RANK or NUMBA_ENABLE_CUDASIM in the environment (a CPU-only machine picks the
    simulator itself)."""
    env = user_env()
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    done = subprocess.run([sys.executable, str(HERE / "spawn_worker.py"), "3"], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert sorted(done.stdout.split()) == ["rank0:6.0", "rank1:6.0", "rank2:6.0"]


def test_errors_are_torch_distributed_errors():
    error = DfcclError("dfccl rank 1: all_reduce failed", rank=1, cause=ValueError("x"))
    assert isinstance(error, dist.DistBackendError) and isinstance(error, dist.DistError)
    assert isinstance(error, PydfcclError) and error.rank == 1
    assert issubclass(DfcclTimeoutError, DfcclError) and issubclass(DfcclTimeoutError,
                                                                     TimeoutError)


def test_the_ddp_benchmark_runs_the_same_program_on_gloo_and_dfccl():
    """examples/ddp_bench.py, tiny: plain DDP (no hook) on both backends in one run, a row
    of steps a second each, and the same final weights."""
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_bench.py"),
                           "--nranks", "2", "--steps", "2", "--warmup", "1", "--layers", "1",
                           "--d-model", "32", "--vocab", "64", "--seq", "8", "--batch", "2",
                           "--timeout", "400"],
                          env=user_env(), capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = dict(re.findall(r"^(gloo|dfccl) +2 +([\d.]+) ", done.stdout, re.M))
    assert set(rows) == {"gloo", "dfccl"} and all(float(v) > 0 for v in rows.values())
    assert "final weights of gloo, dfccl agree" in done.stdout and "(ok)" in done.stdout, \
        done.stdout


def test_the_ddp_benchmark_runs_nccl_one_rank_a_gpu():
    """On one GPU NCCL runs one rank (two on one GPU is an error of NCCL's); gloo and dfccl
    keep --nranks, and nccl on the CPU is left to torch to refuse."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddp_bench", ROOT / "examples" / "ddp_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cuda = bench.parse(["--nranks", "4", "--device", "cuda"])
    assert [bench.ranks_for(b, cuda, 1) for b in ("nccl", "gloo", "dfccl")] == [1, 4, 4]
    assert bench.ranks_for("nccl", cuda, 8) == 4
    assert bench.ranks_for("nccl", bench.parse(["--nranks", "4"]), 1) == 4
