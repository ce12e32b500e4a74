"""pydfccl.torch: argument checks and waiting on the host in this process; the "dfccl"
backend, the DDP hook and the example's first steps with a process per rank (simulator)."""

import json
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import pydfccl.errors as pydfccl_errors  # noqa: E402
import pydfccl.torch as pt  # noqa: E402
from pydfccl.torch.spawn import spawn_ranks  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture(autouse=True)
def device():
    """CUDA tensors on a GPU (the stand-in communicator's runs then pass the real stream
    gate), CPU tensors otherwise."""
    from pydfccl import platform
    dev = "cuda" if platform.gpu_available() else "cpu"
    torch.set_default_device(dev)
    yield dev
    torch.set_default_device("cpu")


def test_importing_pydfccl_does_not_import_torch():
    code = "import sys, pydfccl; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_backend_is_registered():
    assert "DFCCL" in dist.Backend._plugins


# -- argument checks, on a stand-in communicator ------------------------------------------

class FakeComm:
    """What TorchGroup uses of a Communicator; runs complete at once."""

    def __init__(self, rank=0, nranks=2):
        self.rank, self.nranks = rank, nranks
        self.prepared, self.runs = [], []

    def prepare(self, coll_id, kind, count, dtype, op="sum", root=0, peer=None):
        self.prepared.append((coll_id, kind, count, dtype, op, root, peer))

    def run(self, coll_id, send, recv=None):
        self.runs.append(coll_id)
        f = Future()
        f.set_result(recv if recv is not None else send)
        return f


@pytest.fixture
def group():
    return pt.TorchGroup(FakeComm(rank=0, nranks=2))


def test_signatures_get_ids_in_first_seen_order(group):
    pt.all_reduce(torch.ones(4), group=group)
    pt.all_reduce(torch.ones(8), group=group)
    pt.all_reduce(torch.ones(4), group=group)            # seen: same id, no new prepare
    pt.broadcast(torch.ones(4), src=1, group=group)
    pt.isend(torch.ones(3), 1, group=group).wait()
    pt.isend(torch.ones(5), 1, group=group).wait()
    pt.irecv(torch.ones(3), 1, group=group).get_future().wait()   # on CUDA, runs follow
    comm = group.comm                                                # the stream: wait here
    base = pt.group.P2P_BASE
    assert [p[:2] for p in comm.prepared] == [
        (0, "all_reduce"), (1, "all_reduce"), (2, "broadcast"),
        (base + (1 << 20), "send"), (base + (1 << 20) + 1, "send"), (base + (2 << 20), "recv")]
    assert comm.runs == [0, 1, 0, 2, base + (1 << 20), base + (1 << 20) + 1, base + (2 << 20)]


def test_a_failed_run_sticks_to_the_group(group):
    def failing_run(coll_id, send, recv=None):
        f = Future()
        f.set_exception(pydfccl_errors.PydfcclError("collective 0: field 'count' differs"))
        return f

    group.comm.run = failing_run
    work = pt.all_reduce(torch.ones(4), group=group, async_op=True)
    with pytest.raises(pydfccl_errors.PydfcclError, match="differs"):
        work.get_future().wait()
    with pytest.raises(pydfccl_errors.PydfcclError, match="an earlier collective of this "
                                                         "group failed .*'count' differs"):
        pt.all_reduce(torch.ones(4), group=group)


class _LateCallbacks(Future):
    """A future whose done callbacks have not run yet when its waiters wake (they run
    after ``notify_all`` in concurrent.futures: a waiter can be back first)."""

    def add_done_callback(self, fn):
        pass


def _failed_in_flight(coll_id, send, recv=None):
    """rank 2 of the torch fault row, on a loaded machine: the run failed, and the caller's
    next call came before the run's done callback had marked the group."""
    f = _LateCallbacks()
    f.set_exception(pydfccl_errors.AbortedError("rank failure: rank 1: gone"))
    return f


def _refused(coll_id, send, recv=None):
    """The world was aborted before this rank submitted: ``run`` itself raises."""
    raise pydfccl_errors.AbortedError("rank failure: rank 1: gone")


@pytest.mark.parametrize("run", [_failed_in_flight, _refused], ids=["in_flight", "refused"])
def test_a_failed_or_refused_run_fails_the_group_before_the_call_returns(group, run):
    group.comm.run = run
    with pytest.raises(pydfccl_errors.PydfcclError, match="all_reduce failed: AbortedError: "
                                                         "rank failure: rank 1"):
        pt.all_reduce(torch.ones(4), group=group)
    with pytest.raises(pydfccl_errors.PydfcclError, match="an earlier collective of this "
                                                         "group failed .rank failure: rank 1"):
        pt.all_reduce(torch.ones(8), group=group)


@pytest.mark.parametrize("call, error, match", [
    (lambda g: pt.all_reduce(torch.ones(4, 4).t(), group=g), ValueError, "not contiguous"),
    (lambda g: pt.all_reduce(torch.ones(3, dtype=torch.bool), group=g), TypeError,
     "dtype torch.bool is not supported"),
    (lambda g: pt.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND, group=g), ValueError,
     "reduce op .* is not supported"),
    (lambda g: pt.all_gather_into_tensor(torch.empty(5), torch.ones(3), group=g), ValueError,
     "output has 5 elements, needs 2 x 3"),
    (lambda g: pt.reduce_scatter_tensor(torch.empty(2), torch.ones(3), group=g), ValueError,
     "input has 3 elements, needs 2 x 2"),
    (lambda g: pt.all_gather_into_tensor(torch.empty(6, dtype=torch.float64), torch.ones(3),
                                         group=g), TypeError, "output dtype torch.float64"),
    (lambda g: pt.broadcast(torch.ones(3), src=2, group=g), ValueError,
     "broadcast src 2 is not a rank of this group"),
    (lambda g: pt.isend(torch.ones(3), 0, group=g), ValueError, "not this rank"),
    (lambda g: pt.all_to_all_single(torch.empty(4), torch.ones(4), [1, 2], None, group=g),
     ValueError, r"output_split_sizes \[1, 2\] must have one entry per rank \(2\) summing to "
     "the output's first dimension"),
    (lambda g: pt.all_reduce(np.ones(3), group=g), TypeError, "must be a torch.Tensor"),
    (lambda g: pt.all_reduce(torch.ones(3)), ValueError, "not a pydfccl group"),
])
def test_bad_arguments_are_named(group, call, error, match):
    with pytest.raises(error, match=match):
        call(group)
    assert group.comm.runs == []


def test_cpu_tensors_staged_through_the_gpu_come_back_as_the_outputs_alone():
    """CPU tensors on a GPU machine are staged through the GPU (``_staged``): the call
    returns at once, the Work completes once the run has and its result is copied back,
    and its result is the output tensors, as torch's backends give; its future's value can
    be taken apart by torch (DDP's reducer pickles it to find the tensors: the options
    object that torch passes beside them cannot be pickled)."""
    from pydfccl.torch.backend import ProcessGroupDfccl

    run = Future()

    class Staging:
        _rank = 0

        def _comm_device(self):
            return torch.device("cpu")

        def _allreduce(self, tensors, opts=None):
            staged = tensors[0]
            run.add_done_callback(lambda f: staged.mul_(2))
            return pt.Work(run, tensors, what="all_reduce")

    t = torch.ones(3, device="cpu")
    work = ProcessGroupDfccl._staged(Staging(), "_allreduce", ([t], dist.AllreduceOptions()),
                                     {})
    with pytest.raises(pt.DfcclTimeoutError, match="all_reduce did not complete"):
        work.wait(timeout=0.2)               # the run has not completed: nor has the Work
    run.set_result(None)
    assert work.result() == [t] and t.tolist() == [2.0, 2.0, 2.0]
    value = work.get_future().wait()
    assert torch._jit_internal._extract_tensors(value) == [t]


def test_cpu_tensors_of_a_failed_staged_run_hold_nan():
    """A staged run that fails never copies back: the CPU tensors it was to fill still
    hold their input, which must not pass for a result. The float outputs are filled with
    NaN before ``wait()`` raises; an integer input tensor is left alone."""
    from pydfccl.torch.backend import ProcessGroupDfccl

    run = Future()

    class Staging:
        _rank = 0

        def _comm_device(self):
            return torch.device("cpu")

        def _allgather(self, outputs, inputs, opts=None):
            return pt.Work(run, outputs, what="all_gather")

    outs = [[torch.ones(2, 3).t(), torch.ones(3, 2, dtype=torch.int64)]]   # .t(): a copy
    ins = [torch.full((3, 2), 5.0)]
    work = ProcessGroupDfccl._staged(Staging(), "_allgather", (outs, ins), {})
    run.set_exception(pydfccl_errors.AbortedError("rank failure: rank 1: gone"))
    with pytest.raises(pt.DfcclError, match="all_gather failed: AbortedError: rank failure"):
        work.wait()
    assert torch.isnan(outs[0][0]).all()
    assert outs[0][1].tolist() == [[1, 1]] * 3 and ins[0].eq(5.0).all()


def test_work_and_future(group, device):
    t = torch.ones(3)
    work = pt.all_reduce(t, group=group, async_op=True)
    assert work.get_future().wait()[0] is t
    assert work.wait() and work.is_completed() and work.is_success()


# -- waiting on the host ---------------------------------------------------------------------

def test_work_waits_on_the_host_until_the_run_completes():
    run = Future()
    work = pt.Work(run, ["out"])
    with pytest.raises(FutureTimeout):
        work.wait(timeout=0.05)
    threading.Timer(0.05, run.set_result, ("out",)).start()
    assert work.wait(timeout=5) and work.is_success()


# -- ranks as processes (simulator) ------------------------------------------------------------

def run_ranks(case, nranks, timeout=120, **extra):
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           **extra}
    results = spawn_ranks([str(HERE / "torch_workers.py"), case], nranks, timeout=timeout,
                          env=env, capture=True)
    out = []
    for rank, r in enumerate(results):
        lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
        assert r.returncode == 0 and lines, f"rank {rank} ({r.returncode}):\n{r.stderr[-12000:]}"
        out.append(json.loads(lines[-1][len("RESULT "):]))
    return out


@pytest.fixture(scope="module")
def three_ranks():
    """One job of three ranks runs the collectives, the DDP hook and, last (it fails the
    group), mismatched shapes: each rank's results by case."""
    return run_ranks("collectives,ddp,mismatch", 3)


def test_backend_collectives_on_three_ranks(three_ranks):
    out = [r["collectives"] for r in three_ranks]
    for rank, o in enumerate(out):
        assert o["all_reduce"] == [6.0] * 5
        assert o["max"] == [3, 7]
        assert o["all_gather"] == [0.0] * 3 + [1.0] * 3 + [2.0] * 3
        assert o["broadcast"] == [0, 2, 4, 6]
        if rank == 2:
            assert o["reduce"] == [6.0, 6.0]
        assert o["bf16"] == [6.0] * 3
        assert o["reduce_scatter"] == [3.0 * (2 * rank) + 3, 3.0 * (2 * rank + 1) + 3]
        assert o["all_to_all"] == [2 * rank + 10 * k + i for k in range(3) for i in range(2)]
        # rank q's block for this rank starts after its blocks for ranks below this one
        assert o["all_to_allv"] == [10.0 * q + sum((q + p) % 3 for p in range(rank)) + i
                                    for q in range(3) for i in range((q + rank) % 3)]
        assert o["subgroup"] == ([1.0, 1.0] if rank < 2 else [2.0, 2.0])
    assert out[1]["recv"] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("mode", ["overflow", "1"])
def test_a_group_runs_any_number_of_shapes(mode):
    """120 signatures through a group of 4 slots: by default (overflow) 3 keep slots of
    their own and the rest share the last one; with PYDFCCL_TORCH_SHARED_SLOTS=1 all 4 are
    shared."""
    extra = {} if mode == "overflow" else {"PYDFCCL_TORCH_SHARED_SLOTS": mode}
    out = run_ranks("many_shapes", 2, timeout=300, PYDFCCL_TORCH_MAX_COLLS="4", **extra)
    for r in out:
        assert r["many_shapes"]["sums"] == [3.0 * n for n in range(1, 101)]
        assert r["many_shapes"]["shared_slots"] == [1 if mode == "overflow" else 4]
    assert out[1]["many_shapes"]["received"] == [7.0 * n for n in range(1, 21)]


def test_ddp_hook_averages_gradients(three_ranks):
    for r in three_ranks:
        assert r["ddp"]["max_diff"] < 1e-6


def test_mismatched_shapes_fail_with_the_field_and_ranks(three_ranks):
    """Rank r all-reduces 4 + r elements. The error names the field and the ranks seen to
    differ with their counts (which two or three ranks were seen first depends on timing)."""
    for r in three_ranks:
        error = r["mismatch"]["error"]
        assert error is not None
        assert "field 'count' differs across ranks (" in error, error
        seen = re.findall(r"ranks \[([\d, ]+)\]: (\d+)", error)
        assert len(seen) >= 2, error
        for ranks, count in seen:
            assert all(int(count) == 4 + int(rank) for rank in ranks.split(",")), error


def test_example_trains_and_matches_the_reference():
    """Tensor and data parallel, 4 ranks. Data parallel alone, with the metrics group, runs
    as docs/torch.md shows it (tests/unit/test_docs.py), which exits 1 unless it verified."""
    layout = ("--nranks", "4")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), *layout,
                        "--steps", "2", "--check-steps", "2", "--timeout", "150"],
                       env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "verified 2 steps against the single-process reference" in r.stdout
    assert "(ok)" in r.stdout and "(decreasing)" in r.stdout


# steps a layout: enough for well over 30 relaunches on rank 0 (about eight a step with 4
# ranks and tensor parallel 2, about four with 2 ranks)
@pytest.mark.parametrize("layout, steps", [(["--nranks", "4", "--tp", "2"], "8"),
                                           (["--nranks", "2", "--tp", "1"], "15")])
def test_training_with_syncs_between_disordered_issues_survives_frequent_relaunches(layout,
                                                                                    steps):
    """The pattern that stalled on a GPU (rank-dependent issue orders across several groups,
    a device sync and ``.item()`` between the issues, rank processes), for 8-15 steps with a
    quit budget of 5 ms, so that the daemons quit and are relaunched dozens of times: a lost
    relaunch breaks the launcher's rule and fails the job at once, a stall fails it at the
    example's watchdog."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]),
               PYDFCCL_PARAMS="QUIT_AFTER=5000000")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), *layout,
                        "--steps", steps, "--watchdog", "120", "--timeout", "400"],
                       env=env, capture_output=True, text=True, timeout=450)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "(ok)" in r.stdout and "(decreasing)" in r.stdout
    groups, relaunches = map(int, re.search(r"pydfccl on rank 0: (\d+) groups, .* (\d+) daemon "
                                            r"relaunches", r.stdout).groups())
    assert groups >= 3 and relaunches >= 30, r.stdout


def test_example_deadlocks_on_gloo_and_its_watchdog_reports_it():
    """The same program on torch's CPU backend hangs as it would on NCCL (the ranks issue
    their two groups' collectives in opposite orders with a sync between); the example's
    watchdog names the stuck phase and exits 3, instead of a silent hang."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--backend",
                        "gloo", "--nranks", "2", "--tp", "1", "--steps", "2", "--watchdog", "8",
                        "--timeout", "100"],
                       env=env, capture_output=True, text=True, timeout=150)
    assert r.returncode == 3, r.stdout + r.stderr[-3000:]
    # The first watchdog to fire ends its rank, and gloo may then fail the other rank's
    # wait (its peer closed the connection) before that rank's own watchdog fires.
    stalls = re.findall(r"STALL: rank (\d) stuck for \d+ s in step 0 gradient collectives "
                        r"\((\S+) first\)", r.stderr)
    assert stalls and all(first == ("data-parallel" if rank == "0" else "metrics")
                          for rank, first in stalls), r.stderr[-3000:]


def test_ddp_timing_example_trains_both_ways_to_the_same_weights():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT),
                                                      os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_timing.py"), "--nranks", "2",
                        "--steps", "2", "--warmup", "1", "--layers", "2", "--width", "32",
                        "--batch", "4", "--timeout", "150"],
                       env=env, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rows = dict(re.findall(r"^(hook|manual) +([\d.]+) ", r.stdout, re.M))
    assert set(rows) == {"hook", "manual"} and all(float(v) > 0 for v in rows.values())
    assert "the modes' weights agree to" in r.stdout and "(ok)" in r.stdout


@pytest.mark.parametrize("coll", ["all_reduce", "reduce_scatter"])
def test_the_torch_baseline_runs_the_sweep_through_torch_distributed(coll):
    """The bench's NCCL baseline, with torch's gloo backend standing in for NCCL here."""
    from pydfccl.cli.sweep import SweepOptions, run_sweep, sizes

    opts = SweepOptions(coll=coll, nranks=2, minbytes=64, maxbytes=4096, stepfactor=8,
                        iters=2, warmup=1, progress=False)
    rows = run_sweep(opts, "gloo")
    assert [(r["size"], r["count"]) for r in rows] == sizes(opts)
    assert all(r["mode"] == "gloo" and r["wrong"] == 0 and r["time_us"] > 0 for r in rows)


def test_the_torch_baseline_says_why_it_cannot_run():
    from pydfccl.torch.nccl_bench import torch_baseline_unavailable

    assert "not a collective" in torch_baseline_unavailable("send", 2, "gloo")
    assert torch_baseline_unavailable("all_reduce", 2, "gloo") is None
    if torch.cuda.device_count() < 64:
        assert "a GPU per rank" in torch_baseline_unavailable("all_reduce", 64, "nccl")


def test_native_stacks_show_this_process_threads_frames():
    import shutil

    from pydfccl.torch.stall import native_stacks

    if not (shutil.which("cuda-gdb") or shutil.which("gdb")):
        pytest.skip("no debugger on the PATH")
    out = native_stacks(timeout=60)
    if "ptrace" in out and "not permitted" in out:
        pytest.skip("this machine does not let a process be attached to")
    assert out.startswith("native stacks:\n")
    assert "Thread " in out and "\n#0 " in out, out[-2000:]


def test_torch_groups_take_their_sizes_from_the_environment(monkeypatch):
    """A group's world: 64 collectives, the machine's blocks and slots unless the
    PYDFCCL_TORCH_* variables say otherwise (its pool on a GPU grows with each)."""
    from pydfccl import platform
    from pydfccl.torch.backend import comm_options

    for name in ("PYDFCCL_TORCH_MAX_COLLS", "PYDFCCL_TORCH_SLOT_BYTES", "PYDFCCL_TORCH_NBLOCKS"):
        monkeypatch.delenv(name, raising=False)
    for name in ("PYDFCCL_POLICY", "PYDFCCL_PARAMS"):
        monkeypatch.delenv(name, raising=False)
    base = comm_options()
    assert base["max_colls"] == 64 and "nblocks" not in base and base["daemons_per_rank"] == 4
    assert base["policy"].name == "dfccl"
    assert ("slot_bytes" in base) == platform.SIMULATOR
    monkeypatch.setenv("PYDFCCL_TORCH_NBLOCKS", "4")
    monkeypatch.setenv("PYDFCCL_TORCH_MAX_COLLS", "8")
    assert comm_options() == dict(base, max_colls=8, nblocks=4)


def test_torch_groups_take_their_slot_sharing_from_the_environment(monkeypatch):
    from pydfccl.torch.backend import shared_slots_mode

    monkeypatch.delenv("PYDFCCL_TORCH_SHARED_SLOTS", raising=False)
    assert shared_slots_mode() == "overflow"
    for value, mode in (("overflow", "overflow"), ("1", True), ("0", False)):
        monkeypatch.setenv("PYDFCCL_TORCH_SHARED_SLOTS", value)
        assert shared_slots_mode() == mode and type(shared_slots_mode()) is type(mode)
    monkeypatch.setenv("PYDFCCL_TORCH_SHARED_SLOTS", "yes")
    with pytest.raises(ValueError, match=r"PYDFCCL_TORCH_SHARED_SLOTS='yes': use one of "
                                         r"overflow, 1, 0"):
        shared_slots_mode()


def test_torch_groups_take_their_policy_from_the_environment(monkeypatch):
    from pydfccl.torch.backend import comm_options

    monkeypatch.setenv("PYDFCCL_POLICY", "fixed")
    monkeypatch.setenv("PYDFCCL_PARAMS", "QUIT_AFTER=1000, THRESHOLD=7")
    policy = comm_options()["policy"]
    assert policy.name == "fixed"
    assert policy.params["QUIT_AFTER"] == 1000 and policy.params["THRESHOLD"] == 7
    monkeypatch.setenv("PYDFCCL_PARAMS", "QUIT_AFTR=1000")
    with pytest.raises(ValueError, match="PYDFCCL_PARAMS='QUIT_AFTR=1000'.*no parameter"):
        comm_options()
    monkeypatch.setenv("PYDFCCL_POLICY", "fastest")
    monkeypatch.delenv("PYDFCCL_PARAMS")
    with pytest.raises(ValueError, match="PYDFCCL_POLICY='fastest'.*unknown policy"):
        comm_options()
