"""The command line: dispatch, help, and a tiny benchmark run on the simulator."""

import os
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


def test_bench_prints_daemon_and_baseline_rows(capsys):
    assert cli.main(["bench", "--iters", "3", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "daemon (dfccl)" in out and "kernel launch per call" in out
    assert "x baseline" in out


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
