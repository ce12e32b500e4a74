"""The command line: dispatch, help, and a tiny benchmark run on the simulator."""

import os
import re
import subprocess
import sys

import pytest

from pydfccl import cli


def test_usage_and_unknown_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    assert "demo" in capsys.readouterr().out
    assert cli.main(["teleport"]) == 2
    assert "unknown subcommand 'teleport'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(cli.SUBCOMMANDS))
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([name, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_bench_latency_of_many_collectives_at_once_prints_daemon_and_baseline_rows(capsys):
    # 18 collectives: more than the simulator's default world holds, so it is sized for them;
    # every rank checks all 18 results.
    assert cli.main(["bench", "latency", "-k", "18", "-c", "4", "--iters", "2",
                     "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "18 all-reduces submitted together" in out
    assert "daemon (dfccl)" in out and "kernel launch per call" in out
    assert "x baseline" in out


def test_bench_inputs_repeat_their_pattern_and_expected_outputs_are_shared():
    """The sweep's inputs are (i + rank) % 3 + 1, built by repeating a block (fast at
    hundreds of MiB); the expected output of a kind every rank shares is computed once."""
    import numpy as np

    from pydfccl.cli import sweep_measure, sweep_spec

    for elems in (0, 1, 5, 3 << 12, (3 << 12) + 1, 40_000):
        for rank in range(4):
            got = sweep_spec.sweep_input(rank, elems, "int8")
            assert got.dtype == np.int8
            assert np.array_equal(got, (np.arange(elems) + rank) % 3 + 1)
    opts = sweep_spec.SweepOptions(coll="all_reduce", nranks=3)
    sweep_spec.expected_output.cache_clear()
    for rank in range(3):
        comm = type("Comm", (), dict(rank=rank, nranks=3))()
        buffers = (None, sweep_spec.sweep_input(0, 10, "float32") * 0 + 6)   # 1 + 2 + 3
        assert sweep_measure._wrong(comm, opts, 10, buffers) == 0
    assert sweep_spec.expected_output.cache_info().misses == 1


def test_the_torch_baseline_and_the_sweep_share_a_module_not_each_other():
    """``torch.nccl_bench`` takes the sweep's inputs from ``cli.sweep_spec``; neither it nor
    that module imports the sweep's command (no cycle, no private names across)."""
    import ast
    import pathlib

    import pydfccl

    root = pathlib.Path(pydfccl.__file__).parent
    for path in (root / "torch" / "nccl_bench.py", root / "cli" / "sweep_spec.py"):
        imported = {node.module for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert not {m for m in imported if m.endswith("cli.sweep") or m == "sweep"}, path
        names = [alias.name for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ImportFrom) for alias in node.names]
        assert not [n for n in names if n.startswith("_") and n != "__future__"], path


def test_bench_sweeps_sizes_in_nccl_tests_form(tmp_path, capfd):
    """As a user runs it, the progress bar on: rank 0's process draws it on stderr, and
    the tables on stdout read as without it."""
    import json

    from pydfccl.cli.sweep import bus_factor

    out_json, out_csv = tmp_path / "b.json", tmp_path / "b.csv"
    assert cli.main(["bench", "--coll", "all_gather", "--nranks", "3", "-b", "8", "-e", "512",
                     "-f", "4", "-n", "2", "-w", "1", "--baseline", "launch",
                     "--slot-bytes", "64", "--nslots", "3",     # several loops at 504 B
                     "--json", str(out_json), "--csv", str(out_csv)]) == 0
    out, err = capfd.readouterr()
    assert "bench all_gather: 100%" in err and "4/4" in err          # a size a step
    assert "bench all_gather" not in out
    assert "nslots 3, slot_bytes 64" in out         # the world sizes reach the ranks
    assert "size(B)" in out and "busbw(GB/s)" in out and "#wrong" in out
    assert "Avg bus bandwidth" in out and "x daemon" in out
    rows = json.loads(out_json.read_text())["rows"]
    assert {r["mode"] for r in rows} == {"daemon", "launch"}
    # size: all 3 ranks' blocks (3 x count x 4 bytes), count = bytes // (4 x 3), at least 1
    assert [r["size"] for r in rows if r["mode"] == "daemon"] == [12, 24, 120, 504]
    for r in rows:
        assert r["wrong"] == 0
        assert abs(r["busbw"] - r["algbw"] * 2 / 3) < 1e-9      # all_gather: (n-1)/n
        assert r["preemptions"] >= 0 if r["mode"] == "daemon" else r["preemptions"] == 0
        # the timed runs' launches: a kernel for each run on each rank in the baseline
        assert r["launches"] >= (3 * 2 if r["mode"] == "launch" else 0)
    assert "preempt" in out and "launches" in out
    assert out_csv.read_text().splitlines()[0].startswith("mode,size,count")
    assert bus_factor("all_reduce", 4) == 1.5 and bus_factor("broadcast", 4) == 1.0
    assert "a thread or process per rank (processes backend)" in out   # the simulator


def test_bench_driver_one_needs_a_gpu_and_the_threads_backend(capsys):
    assert cli.main(["bench", "--driver", "one"]) == 2
    assert "--driver one needs a GPU" in capsys.readouterr().err


def test_pydfccl_debug_configures_logging_or_names_a_bad_level():
    def run(level):
        env = dict(os.environ, PYDFCCL_DEBUG=level)
        code = "import pydfccl, logging; print(logging.getLogger('pydfccl').level)"
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=120)

    ok = run("info")
    assert ok.returncode == 0 and ok.stdout.strip() == "20"
    bad = run("chatty")
    assert bad.returncode != 0 and "PYDFCCL_DEBUG='CHATTY' is not a logging level" in bad.stderr


def test_doctor_reports_each_fact(capsys, monkeypatch):
    from pydfccl.cli import doctor

    assert cli.main(["doctor"]) == 0          # a CPU machine with the test extra: no problem
    out = capsys.readouterr().out
    assert "versions" in out and "numba-cuda" in out
    assert "Numba CUDA simulator" in out and "kernel cache" in out
    assert re.search(r"ok +work queues +CUDA_DEVICE_MAX_CONNECTIONS=32\n", out)
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")     # as Megatron-LM sets it
    assert cli.main(["doctor"]) == 0
    assert re.search(r"note +work queues +CUDA_DEVICE_MAX_CONNECTIONS=1: ranks that are "
                     r"threads", capsys.readouterr().out)
    # the known incompatibility is a problem, and makes the exit status 1
    real = doctor._version
    monkeypatch.setattr(doctor, "_version", lambda name: {"numpy": "2.5.2", "numba-cuda":
                                                          "0.30.4"}.get(name) or real(name))
    assert cli.main(["doctor"]) == 1
    assert "PROBLEM numpy" in capsys.readouterr().out


def test_doctor_probes_the_kernel_cache_beside_the_kernels(monkeypatch):
    """Numba caches the daemon beside its source, in pydfccl/kernels/__pycache__ (not
    beside the command line's modules), unless NUMBA_CACHE_DIR says elsewhere."""
    import pathlib

    import pydfccl.kernels
    from pydfccl.cli import doctor

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    kernels = pathlib.Path(pydfccl.kernels.__file__).resolve().parent
    assert pathlib.Path(doctor.kernel_cache_dir()) == kernels / "__pycache__"
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/else")
    assert doctor.kernel_cache_dir() == "/somewhere/else"


def test_one_thread_issues_every_ranks_kth_collective_before_any_ranks_next():
    """A launch per call from one thread deadlocks rank by rank (the first rank's kernel
    spins for peers whose launches queue behind it)."""
    from pydfccl.cli.bench import group_order

    comms = ["rank0", "rank1", "rank2"]
    pairs = [[(f"x{r}{k}", f"y{r}{k}") for k in range(2)] for r in range(3)]
    assert group_order(comms, pairs) == [
        ("rank0", 0, "x00", "y00"), ("rank1", 0, "x10", "y10"), ("rank2", 0, "x20", "y20"),
        ("rank0", 1, "x01", "y01"), ("rank1", 1, "x11", "y11"), ("rank2", 1, "x21", "y21")]


def test_bench_latency_reports_a_failed_measurement_and_keeps_the_rows_before(monkeypatch,
                                                                               capsys):
    from pydfccl.cli import bench
    from pydfccl.errors import DeadlockError

    def measure(*args):
        if args[6]:      # persistent: the daemon's row
            return dict(median=5.0, p10=4.0, p90=6.0, submit=1.0, stats=[{"launches": 1}])
        raise DeadlockError("deadlock: no progress on any rank for 20.0 s\nrank 0: ...")

    monkeypatch.setattr(bench, "measure_latency", measure)
    assert bench.main(["--iters", "3", "--driver", "threads"]) == 1
    out = capsys.readouterr().out
    assert "kernel launch per call   failed: deadlock: no progress" in out
    assert "daemon (dfccl)" in out and "5.0" in out


def test_bench_rows_gain_the_hbm_keys_and_keep_the_old_ones(monkeypatch, tmp_path, capsys):
    """The HBM efficiency table as on a GPU (threads backend), its copy figures given: the
    CSV and JSON rows keep nccl-tests' keys, in order, and gain the HBM ones."""
    import csv
    import json

    from pydfccl import platform
    from pydfccl.cli import hbm, sweep, sweep_measure

    real = sweep.hbm_report

    def on_a_gpu(results, opts, backend):     # only the report thinks it is on a GPU
        with monkeypatch.context() as m:
            m.setattr(platform, "gpu_available", lambda: True)
            m.setattr(sweep_measure, "on_gpu", lambda: True)
            m.setattr(hbm, "copy_bandwidths", lambda sizes: {s: 1000.0 for s in sizes})
            return real(results, opts, "threads")

    monkeypatch.setattr(sweep, "hbm_report", on_a_gpu)
    out_json, out_csv = tmp_path / "b.json", tmp_path / "b.csv"
    # the daemon's rows alone: the baseline's rows take the same keys (the sweep's test above
    # writes both modes' rows)
    assert cli.main(["bench", "--nranks", "2", "-b", "8", "-e", "16", "-n", "1", "-w", "0",
                     "--baseline", "none", "--json", str(out_json),
                     "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "HBM efficiency (all_reduce, 2 ranks on this GPU)" in out and "% of copy" in out
    old = ["mode", "size", "count", "type", "redop", "root", "time_us", "algbw", "busbw",
           "wrong", "preemptions", "launches"]
    new = ["hbm_bytes", "hbm_gbs", "copy_gbs", "hbm_pct_of_copy"]
    with open(out_csv, newline="") as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == old + new
        rows = list(reader)
    assert [(r["mode"], r["size"], r["hbm_bytes"]) for r in rows] == [
        ("daemon", "8", "80"), ("daemon", "16", "160")]   # one-shot: n(3n-1) x size, n = 2
    for r in json.loads(out_json.read_text())["rows"]:
        assert list(r) == old + new
        assert r["copy_gbs"] == 1000.0
        assert r["hbm_gbs"] == pytest.approx(r["hbm_bytes"] / r["time_us"] / 1e3)


def test_bench_param_overrides_the_daemon_policy_only(monkeypatch, capsys):
    from pydfccl.cli import sweep_measure

    seen = {}

    def fake_launch(worker, nranks, *, policy, **kw):
        seen.setdefault("policies", []).append(policy)
        steps = kw["args"][1]
        return [[dict(seconds=1e-3, wrong=0, preemptions=0, launches=0) for _ in steps]
                for _ in range(nranks)]

    monkeypatch.setattr(sweep_measure, "launch", fake_launch)
    assert cli.main(["bench", "--nranks", "2", "-b", "8", "-e", "8", "--baseline", "nccl",
                     "--driver", "threads", "--no-hbm",
                     "--param", "BASE=123456", "--param", "NUM_TRY=2"]) == 0
    daemon, baseline = seen["policies"]
    assert daemon.params["BASE"] == 123456 and daemon.params["NUM_TRY"] == 2
    assert daemon.params["FACTOR"] == 5                 # the others keep their defaults
    assert "BASE" not in daemon.sim_params              # the override holds on the simulator
    assert baseline == "nccl"
    assert "BASE=123456 NUM_TRY=2" in capsys.readouterr().out

    assert cli.main(["bench", "--param", "NOPE=1"]) == 2
    assert "has no parameter(s) ['NOPE']" in capsys.readouterr().err
    assert cli.main(["bench", "--param", "BASE"]) == 2
    assert "expected NAME=INTEGER" in capsys.readouterr().err


def test_param_reaches_the_daemons_of_bench_latency_and_the_demo(monkeypatch, capsys):
    """``--param`` sets the daemon policy's parameters in ``bench latency`` (its launch
    baseline keeps the nccl policy) and in the demo, as in the sweep; a bad one exits 2."""
    from pydfccl.cli import bench, demo

    policies = []

    def measure(*args):
        policies.append(args[5])
        return dict(median=5.0, p10=4.0, p90=6.0, submit=1.0, stats=[{"launches": 1}])

    monkeypatch.setattr(bench, "measure_latency", measure)
    assert bench.main(["--iters", "3", "--driver", "threads",
                       "--param", "HEAD_BASE=20000"]) == 0
    daemon, baseline = policies
    assert daemon.name == "dfccl" and daemon.params["HEAD_BASE"] == 20000
    assert baseline == "nccl"
    assert "submit to future completion, HEAD_BASE=20000" in capsys.readouterr().out
    assert cli.main(["bench", "latency", "--param", "NOPE=1"]) == 2
    assert capsys.readouterr().err == (
        "python -m pydfccl bench: error: --param policy 'dfccl' has no parameter(s) "
        "['NOPE']; known: ['BASE', 'FACTOR', 'HEAD_BASE', 'NUM_TRY', 'ORDER_BY_ID', "
        "'PRIORITY_SHIFT', 'QUIT_AFTER']\n")       # one line, no traceback

    seen = []

    def run_demo(opts, backend=None, watchdog_timeout=None, group=None, **config):
        seen.append(opts.policy)
        raise demo.RankFailedError(0, "stopped here")

    monkeypatch.setattr(demo, "run_demo", run_demo)
    cli.main(["demo", "-n", "2", "-i", "1", "--param", "BASE=7",
              "--param", "HEAD_BASE=9"])
    (policy,) = seen
    assert (policy.params["BASE"], policy.params["HEAD_BASE"]) == (7, 9)
    assert "policy dfccl BASE=7 HEAD_BASE=9, sync none" in capsys.readouterr().out
    assert cli.main(["demo", "--param", "BASE"]) == 2
    assert "expected NAME=INTEGER" in capsys.readouterr().err
    # a replay takes --param too, checked before the file is read
    assert cli.main(["demo", "--schedule", "x.json", "--param", "NOPE=1"]) == 2
    assert "--param policy 'dfccl' has no parameter(s) ['NOPE']" in capsys.readouterr().err


def test_bench_param_reaches_the_ranks_daemons(tmp_path, capsys):
    """``--param BASE=...`` sets the rank processes' wait budget: at 1 ns every wait that is
    not already met is preempted, at 10 s none is. How many waits are met at once depends
    on how the rank processes happen to run (a loaded run of 10 gave 70 preemptions, an
    idle one 119), so the bound is the difference between the two settings, not a count:
    some preemptions against none. The results stay exact either way."""
    import json

    preempted = {}
    for base in ("1", "10000000000"):
        out_json = tmp_path / f"b{base}.json"
        assert cli.main(["bench", "--nranks", "2", "-b", "4096", "-e", "4096", "-n", "10",
                         "-w", "1", "--baseline", "none", "--slot-bytes", "256",
                         "--param", f"BASE={base}", "--json", str(out_json)]) == 0
        (row,) = json.loads(out_json.read_text())["rows"]
        assert row["wrong"] == 0
        preempted[base] = row["preemptions"]
    assert preempted["1"] >= 10 and preempted["10000000000"] == 0, preempted
    # 2 ranks' lanes are whole 256-byte slots: 4 KiB runs in the ring
    assert "# all_reduce up to 256 bytes runs one-shot, larger in the ring" in \
        capsys.readouterr().out


def test_bench_cycles_alternate_the_modes_and_report_each_sizes_median(monkeypatch, tmp_path,
                                                                       capsys):
    """-N 3: the modes take turns three times; each size reports the median cycle's row,
    the fastest and slowest times beside it, and #wrong summed over the cycles."""
    import json

    from pydfccl.cli import sweep_measure

    order, seconds = [], iter([3e-3, 5e-3, 1e-3, 6e-3, 2e-3, 4e-3])   # daemon, nccl, ...

    def fake_launch(worker, nranks, *, policy, **kw):
        order.append("nccl" if policy == "nccl" else "daemon")
        t = next(seconds)
        return [[dict(seconds=t, wrong=1 if t == 1e-3 else 0, preemptions=0, launches=0)
                 for _ in kw["args"][1]] for _ in range(nranks)]

    monkeypatch.setattr(sweep_measure, "launch", fake_launch)
    out_json = tmp_path / "b.json"
    assert cli.main(["bench", "--nranks", "2", "-b", "8", "-e", "8", "-N", "3", "--baseline",
                     "nccl", "--driver", "threads", "--no-hbm",
                     "--json", str(out_json)]) == 1         # a cycle read wrong results
    assert order == ["daemon", "nccl"] * 3
    rows = {r["mode"]: r for r in json.loads(out_json.read_text())["rows"]}
    assert rows["daemon"]["time_us"] == 2e3              # of 3, 1 and 2 ms
    assert (rows["daemon"]["time_min_us"], rows["daemon"]["time_max_us"]) == (1e3, 3e3)
    assert rows["daemon"]["wrong"] == 2 and rows["daemon"]["cycles"] == 3   # 2 ranks, once
    assert rows["nccl"]["time_us"] == 5e3 and rows["nccl"]["wrong"] == 0
    out = capsys.readouterr()
    assert "bench: 2 wrong elements" in out.err
    assert "median of 3 cycles" in out.out and "min(us)" in out.out
    assert "# cycle 2/3, daemon: Avg bus bandwidth" in out.out     # each cycle's own times
    assert "time(us) by size(B): 8:1000.0" in out.out and "8:6000.0" in out.out
    assert "2.50" in out.out                              # nccl's 5 ms over the daemon's 2
    # paired within each cycle: 5/3, 6/1 and 4/2, of which the median is 2
    assert rows["nccl"]["x_daemon_paired"] == 2.0 and "x paired" in out.out

    assert cli.main(["bench", "-N", "0"]) == 2
    assert "-N/--cycles must be at least 1" in capsys.readouterr().err


def test_nblocks_reaches_the_worlds_of_bench_latency_and_the_demo(monkeypatch, capsys):
    """``--nblocks`` sets a rank's daemon blocks (the machine's default otherwise), so that
    the GPU batch can time block counts against each other (stage ``blocks_ab``)."""
    from pydfccl.cli import bench, demo

    seen = []

    def measure(*args):
        seen.append(args[-1])
        return dict(median=5.0, p10=4.0, p90=6.0, submit=1.0, stats=[{"launches": 1}])

    monkeypatch.setattr(bench, "measure_latency", measure)
    assert bench.main(["--iters", "3", "--driver", "threads", "--no-baseline"]) == 0
    assert bench.main(["--iters", "3", "--driver", "threads", "--no-baseline",
                       "--nblocks", "2"]) == 0
    assert seen == [None, 2]
    assert bench._sizes(1, None, 2) == {"nblocks": 2}
    assert bench._sizes(1, None, None) == {}

    configs = []

    def run_demo(opts, backend=None, watchdog_timeout=None, group=None, **config):
        configs.append(config)
        raise demo.RankFailedError(0, "stopped here")

    monkeypatch.setattr(demo, "run_demo", run_demo)
    cli.main(["demo", "-n", "2", "-i", "1", "--nblocks", "3"])
    cli.main(["demo", "-n", "2", "-i", "1"])
    assert configs == [{"nblocks": 3}, {}]
    capsys.readouterr()


def test_demo_as_a_user_runs_it_draws_its_progress_bar_beside_the_summary(tmp_path, capfd):
    import json

    path = tmp_path / "demo.json"
    assert cli.main(["demo", "-n", "2", "-k", "2", "-i", "2", "-c", "10", "--param",
                     "NUM_TRY=4", "--json", str(path)]) == 0
    written = json.loads(path.read_text())
    assert written["options"]["policy"]["name"] == "dfccl"
    assert written["options"]["policy"]["params"]["NUM_TRY"] == 4
    assert [r["verified"] for r in written["ranks"]] == [4, 4]
    out, err = capfd.readouterr()
    assert "chaos 2 ranks x 2 all-reduces: 100%" in err and "2/2" in err
    head, table, *ranks, summary = out.splitlines()
    assert head.startswith("pydfccl chaos demo on the ")
    assert "policy dfccl NUM_TRY=4, sync none" in head
    assert table.split() == ["rank", "verified", "preempt", "relaunch", "steps"]
    assert [line.split()[:2] for line in ranks] == [["0", "4"], ["1", "4"]]
    assert summary.startswith("iterations: 2; outputs verified: 8 ")


def test_demo_summary_gives_the_median_iteration_beside_the_mean():
    """A first iteration's warm-up (first calls, first launches) can weigh more than all the
    others in the mean time in collectives; the summary gives the median and the first."""
    from pydfccl.cli.demo import DemoOptions, summarize

    ranks = [dict(rank=r, verified=3, preemptions=0, relaunches=0, steps=9, seconds=1.0,
                  collective_seconds=each, fill_seconds=0.03 * (r + 1), check_seconds=0.06)
             for r, each in enumerate(([0.5, 0.002, 0.004], [0.3, 0.004, 0.002]))]
    text = summarize(DemoOptions(nranks=2, colls=1, iters=3), ranks)
    assert "of which 135.33 ms from a rank's first submission" in text
    assert "the rest is filling, 15.00 ms, checking, 20.00 ms, and waiting" in text
    assert "median iteration 3.00 ms, the first 400.00 ms" in text


def test_demo_passes_the_policy_the_parser_built_down_to_launch(monkeypatch, capsys):
    """The policy is built once, from --policy and --param, and that very object reaches
    ``launch``: nothing on the way looks it up again by name."""
    from pydfccl.cli import demo

    built, launched = [], []
    real = demo.chosen_policy

    def chosen_policy(args):
        built.append(real(args))
        return built[-1]

    def launch(worker, nranks, *, policy, **kw):
        launched.append(policy)
        raise demo.RankFailedError(0, "stopped here")

    monkeypatch.setattr(demo, "chosen_policy", chosen_policy)
    monkeypatch.setattr(demo, "launch", launch)
    assert cli.main(["demo", "-n", "2", "-i", "1", "--param", "BASE=7"]) == 1
    ((policy, overrides),) = built
    assert launched == [policy] and launched[0] is policy
    assert policy.params["BASE"] == 7 and overrides == {"BASE": 7}
    assert "FAILED: rank 0: stopped here" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["-n", "4", "-k", "3"], "100% disorder needs at least as many collectives (3) as ranks "
                             "(4)"),
    (["--kinds", "all_reduce,teleport"], "--kinds: unknown collective kind(s) ['teleport']"),
    (["--nblocks", "0"], "--nblocks must be in 1..32"),
    (["--param", "BASE"], "--param 'BASE': expected NAME=INTEGER"),
    (["--schedule", "x.json", "--param", "NOPE=1"], "--param policy 'dfccl' has no "
                                                    "parameter(s) ['NOPE']"),
    (["--schedule", "no/such/schedule.json"], "--schedule no/such/schedule.json: [Errno 2] "
                                              "No such file or directory"),
])
def test_demo_names_a_bad_argument_in_one_line_and_exits_2(argv, message, capsys):
    assert cli.main(["demo"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pydfccl demo: error: " + message), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_demo_schedule_that_does_not_parse_is_a_usage_error(tmp_path, capsys):
    broken, not_one = tmp_path / "broken.json", tmp_path / "not_one.json"
    broken.write_text('{"nranks": 2, "collectives": ')
    not_one.write_text('{"nranks": 2}')
    for path, why in ((broken, "JSONDecodeError"), (not_one, "KeyError: 'collectives'")):
        assert cli.main(["demo", "--schedule", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"python -m pydfccl demo: error: --schedule {path}: not a "
                              f"schedule ({why}"), err
        assert err.count("\n") == 1


def test_demo_replays_a_schedule_beside_the_model(tmp_path, capsys):
    """``demo --schedule FILE``: the engine's run and the model's prediction, a line each."""
    import json

    schedule = dict(nranks=2, collectives={"0": dict(count=20), "1": dict(count=20)},
                    ranks=[[dict(op="submit", coll=0), dict(op="submit", coll=1)],
                           [dict(op="submit", coll=1), dict(op="sync"),
                            dict(op="submit", coll=0)]])
    path = tmp_path / "two.json"
    path.write_text(json.dumps(schedule))
    assert cli.main(["demo", "--schedule", str(path)]) == 0
    engine, model = capsys.readouterr().out.splitlines()
    assert engine.startswith(f"schedule {path} (2 ranks, 2 all-reduces of float32, policy "
                             "dfccl) on the CUDA simulator: completed in ")
    assert "4 results verified" in engine
    assert model.startswith("model (dfccl): completed after ")


def test_demo_replays_an_all_to_allv_schedule(tmp_path, capsys):
    """An all_to_allv beside an all-reduce, submitted in opposite orders: the engine
    completes and verifies it as the model predicts; under nccl both deadlock."""
    import json

    schedule = dict(nranks=3, collectives={
        "0": dict(count=5, kind="all_to_allv", counts=[[1, 5, 0], [2, 0, 3], [4, 4, 4]]),
        "1": dict(count=20)},
        ranks=[[dict(op="submit", coll=0), dict(op="submit", coll=1)],
               [dict(op="submit", coll=1), dict(op="submit", coll=0)],
               [dict(op="submit", coll=0), dict(op="submit", coll=1)]])
    path = tmp_path / "split.json"
    path.write_text(json.dumps(schedule))
    assert cli.main(["demo", "--schedule", str(path)]) == 0
    engine, model = capsys.readouterr().out.splitlines()
    assert engine.startswith(f"schedule {path} (3 ranks, 2 collectives (all_reduce, "
                             "all_to_allv) of float32, policy dfccl) on the CUDA simulator: "
                             "completed in "), engine
    assert "6 results verified" in engine
    assert model.startswith("model (dfccl): completed after ")
    # the engine's deadlock is named by the watchdog: 3 s, not the default 30
    assert cli.main(["demo", "--schedule", str(path), "--policy", "nccl",
                     "--watchdog", "3"]) == 3
    engine, model = capsys.readouterr().out.splitlines()[:2]
    assert "deadlock" in engine and model.startswith("model (nccl): deadlock after ")


def test_bench_passes_the_policy_the_parser_built_down_to_launch(monkeypatch, capsys):
    from pydfccl.cli import sweep, sweep_measure

    built, launched = [], []
    real = sweep.chosen_policy

    def chosen_policy(args):
        built.append(real(args))
        return built[-1]

    def fake_launch(worker, nranks, *, policy, **kw):
        launched.append(policy)
        return [[dict(seconds=1e-3, wrong=0, preemptions=0, launches=0) for _ in kw["args"][1]]
                for _ in range(nranks)]

    monkeypatch.setattr(sweep, "chosen_policy", chosen_policy)
    monkeypatch.setattr(sweep_measure, "launch", fake_launch)
    assert cli.main(["bench", "-b", "8", "-e", "8", "--baseline", "none", "--no-hbm",
                     "--param", "NUM_TRY=3"]) == 0
    ((policy, _),) = built
    assert len(launched) == 1 and launched[0] is policy and policy.params["NUM_TRY"] == 3
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["-N", "0"], "-N/--cycles must be at least 1, got 0"),
    (["-r", "2"], "root 2 out of range for 2 ranks"),
    (["--slot-bytes", "20"], "--slot-bytes must be a positive multiple of 16"),
    (["--nblocks", "0"], "--nblocks must be in 1..32"),
    (["--backend", "threads"], "--backend threads needs a GPU"),
    (["--param", "NOPE=1"], "--param policy 'dfccl' has no parameter(s) ['NOPE']"),
])
def test_bench_names_a_bad_argument_in_one_line_and_exits_2(argv, message, capsys):
    from pydfccl import platform

    if "--backend" in argv and platform.gpu_available():
        pytest.skip("a GPU runs the threads backend")
    assert cli.main(["bench"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pydfccl bench: error: " + message), err
    assert err.count("\n") == 1


def test_bench_whose_hbm_table_fails_still_writes_its_rows_and_exits_1(monkeypatch, tmp_path,
                                                                       capsys):
    """The HBM table is an extra: when it fails, its traceback is shown, the rows are still
    written, and the exit status says the run was not clean."""
    import json

    from pydfccl.cli import sweep, sweep_measure

    def fake_launch(worker, nranks, *, policy, **kw):
        return [[dict(seconds=1e-3, wrong=0, preemptions=0, launches=0) for _ in kw["args"][1]]
                for _ in range(nranks)]

    def broken(results, opts, backend):
        raise RuntimeError("no copy engine today")

    monkeypatch.setattr(sweep_measure, "launch", fake_launch)
    monkeypatch.setattr(sweep, "hbm_report", broken)
    out_json = tmp_path / "b.json"
    assert cli.main(["bench", "-b", "8", "-e", "16", "--baseline", "none",
                     "--json", str(out_json)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: no copy engine today" in err
    assert "bench: the HBM efficiency table failed" in err
    options = json.loads(out_json.read_text())["options"]
    assert [r["size"] for r in json.loads(out_json.read_text())["rows"]] == [8, 16]
    assert options["policy"]["name"] == "dfccl" and options["policy"]["params"]["BASE"] > 0


@pytest.mark.parametrize("argv, message", [
    (["-k", "0"], "--nranks, --iters, --count and --colls must be at least 1"),
    (["-k", "500"], "-k/--colls must be in 1..128"),
    (["--nthreads", "0"], "--nthreads must be in 1.."),
    (["--driver", "one"], "--driver one needs a GPU"),
    (["--param", "HEAD_BASE"], "--param 'HEAD_BASE': expected NAME=INTEGER"),
])
def test_bench_latency_names_a_bad_argument_in_one_line_and_exits_2(argv, message, capsys):
    from pydfccl import platform

    if "--driver" in argv and platform.gpu_available():
        pytest.skip("a GPU runs one thread for every rank")
    assert cli.main(["bench", "latency"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m pydfccl bench: error: " + message), err
    assert err.count("\n") == 1


@pytest.mark.parametrize("argv", [["demo"], ["bench"], ["bench", "latency"], ["soak"]])
def test_a_backend_the_environment_names_wrongly_is_one_line(argv, monkeypatch, capsys):
    monkeypatch.setenv("PYDFCCL_BACKEND", "carrier-pigeon")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (f"python -m pydfccl {argv[0]}: error: PYDFCCL_BACKEND='carrier-pigeon'; "
                   "choose from ('threads', 'processes')\n"), err


def test_bench_registration_prints_both_rows(capsys):
    """``bench registration``: prepare + start of many collectives sharing the slots, with
    the collectives that fit the slots as the baseline, the same memory in both rows."""
    assert cli.main(["bench", "registration", "-k", "300", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    own = re.search(r"^slots of their own\s+(\d+)\s.*\s([\d.]+)\s+([\d.]+)$", out, re.M)
    shared = re.search(r"^shared slots\s+300\s.*\s([\d.]+)\s+([\d.]+)$", out, re.M)
    assert own and shared, out
    assert own.groups()[1:] == shared.groups()
