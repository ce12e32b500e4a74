"""``python -m pydfccl bench startup`` as a user types it: fresh processes, cold and warm
(and with a prebuilt cache), every phase timed and the first all-reduce verified."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PHASES = ["import pydfccl", "runtime modules (numba.cuda)", "CUDA context, after the imports",
          "daemon compile or load", "ranks up", "prepare + start", "first verified collective", "ranks down",
          "process start to the verified result", "whole process, with its exit"]


def _bench(*argv):
    return subprocess.run([sys.executable, "-m", "pydfccl", "bench", "startup", *argv],
                          cwd=ROOT, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
                          capture_output=True, text=True, timeout=1500)


def test_bench_startup_prints_each_phase_cold_warm_and_prebuilt(tmp_path):
    prebuilt = tmp_path / "kernels"
    prebuilt.mkdir()
    proc = _bench("--warm", "1", "--json", str(tmp_path / "s.json"), "--prebuilt", str(prebuilt))
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "backend: simulator" in lines
    header = next(line for line in lines if line.startswith("phase"))
    assert header.split()[-6:] == ["cold", "(s)", "warm", "(s)", "prebuilt", "(s)"]
    for name in ["python -c pass (baseline)"] + PHASES:
        row = next(line for line in lines if line.startswith(name))
        assert len([float(x) for x in row[len(name):].split()]) == 3, row
    report = json.loads((tmp_path / "s.json").read_text())
    for phases in (report["cold"], report["warm"][0], report["prebuilt"]):
        assert list(phases) == PHASES
        assert all(v >= 0 for v in phases.values()), phases
        # from outside: the result comes after the process imported pydfccl, and the
        # process ends after it
        to_result = phases["process start to the verified result"]
        assert phases["import pydfccl"] < to_result < phases["whole process, with its exit"]
        assert to_result >= phases["first verified collective"] + phases["prepare + start"]
    assert report["baseline"] > 0


def test_bench_startup_names_a_bad_argument():
    proc = _bench("--prebuilt", "/no/such/dir")
    assert proc.returncode == 2
    assert "--prebuilt /no/such/dir: no such directory" in proc.stderr


def test_each_daemon_a_program_starts_is_logged_with_how_it_was_got():
    proc = subprocess.run([sys.executable, "-m", "pydfccl", "demo", "-n", "2", "-k", "2", "-i",
                           "1", "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYDFCCL_DEBUG="INFO"),
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    made = [line for line in proc.stderr.splitlines() if "INFO daemon dfccl for" in line]
    assert len(made) == 2, proc.stderr[-3000:]          # one a rank process, each once
    assert all("made (the simulator compiles nothing)" in line for line in made)


def test_modules_without_cached_byte_code_are_counted_by_package(tmp_path):
    import py_compile
    import types

    from pydfccl.cli.startup import _byte_code_note
    from pydfccl.cli.startup_probe import sources_without_byte_code

    modules = {}
    for name in ("pkg", "pkg.cached", "pkg.bare", "other.bare"):
        source = tmp_path / f"{name}.py"
        source.write_text("x = 1\n")
        modules[name] = types.ModuleType(name)
        modules[name].__file__ = str(source)
    py_compile.compile(modules["pkg.cached"].__file__, doraise=True)
    modules["builtin"] = types.ModuleType("builtin")            # no file: not counted
    assert sources_without_byte_code(modules) == {"pkg": 2, "other": 1}
    note = _byte_code_note({"pkg": 2, "other": 1})
    assert note.startswith("Byte code: 3 imported modules had none cached")
    assert "(pkg 2, other 1)" in note
    assert _byte_code_note({}) == ""
    many = _byte_code_note({f"p{i}": 10 - i for i in range(8)})
    assert "(p0 10, p1 9, p2 8, p3 7, p4 6, 12 in 3 more)" in many


def test_the_context_floor_is_timed_where_a_driver_makes_a_context(tmp_path, standin_driver):
    """With a stand-in libcuda.so.1 whose calls succeed, the bare process reports when it
    had the context; without a driver there is no floor to report."""
    import ctypes

    from pydfccl.cli.startup import context_alone

    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:       # no driver here: nothing to time
        assert context_alone(dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))) is None
    folder = standin_driver(
        "int cuInit(unsigned f) { return 0; }\n"
        "int cuDeviceGet(int *d, int i) { *d = i; return 0; }\n"
        "int cuDevicePrimaryCtxRetain(void **c, int d) { *c = (void *)1; return 0; }\n")
    seconds = context_alone(dict(os.environ, LD_LIBRARY_PATH=folder))
    assert seconds is not None and 0 < seconds < 300
