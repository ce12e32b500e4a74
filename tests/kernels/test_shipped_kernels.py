"""The daemons shipped as cubins (``kernels/shipped/``): each matches today's sources and
keeps within today's registers and stack frame, the default daemon for H100/H200 is among
them, a lookup finds only an exact match, and the runtime takes a shipped daemon instead
of compiling one."""

import dataclasses
import fnmatch
from pathlib import Path

import pytest

from pydfccl.host import daemons
from pydfccl.kernels.compiler import cache_key
from pydfccl.kernels.limits import MAX_THREADS, register_cap
from pydfccl.kernels.daemon import DAEMON_SIGNATURE
from pydfccl.kernels.shipped import (SHIPPED_DIR, ShippedDaemon, find_shipped, ship,
                                     shipped_daemons)
from pydfccl.platform import backend
from pydfccl.platform.cubin_resources import kernel_resources
from pydfccl.sched.policies import get_policy

ROOT = Path(__file__).resolve().parents[2]
REBUILD = "python -m pydfccl build-kernels --ship --policy {policy} --nthreads {nthreads}"


def test_every_shipped_daemon_matches_todays_sources():
    shipped = shipped_daemons()
    assert shipped, "no daemons shipped: " + REBUILD.format(policy="dfccl",
                                                              nthreads=MAX_THREADS)
    for d in shipped:
        policy = get_policy(d.policy)
        assert d.key == cache_key(policy, d.registers), (
            f"the shipped {d.file} was built from other sources than today's: run "
            + REBUILD.format(policy=d.policy, nthreads=d.nthreads))
        assert d.registers == register_cap(d.nthreads)
        assert d.nargs == DAEMON_SIGNATURE.count("int64") and d.entry
        assert d.image()[:4] == b"\x7fELF"        # a cubin, not PTX
    assert any((d.policy, d.nthreads, d.cc) == ("dfccl", MAX_THREADS, (9, 0))
               for d in shipped), "the default daemon for H100/H200 is not shipped"


# Per thread, as linked with the CUDA 13 packages the project installs: the daemon runs
# under a register cap, so device code that needs more registers spills into the stack
# frame, which every step then reads and writes.
STACK_FRAME_BYTES = {"dfccl": 216, "nccl": 208}


def test_the_shipped_daemons_keep_todays_registers_and_stack_frame():
    for d in shipped_daemons():
        used = kernel_resources(d.image(), d.entry)
        assert used.registers <= d.registers, (d.file, used)
        assert used.frame_bytes <= STACK_FRAME_BYTES[d.policy], (
            f"{d.file}: a {used.frame_bytes}-byte stack frame a thread, against "
            f"{STACK_FRAME_BYTES[d.policy]} before: the daemon spills more")


def test_a_cubin_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="ELF"):
        kernel_resources(b"// PTX text, not a cubin", "daemon")
    d = shipped_daemons()[0]
    with pytest.raises(KeyError, match="no symbol"):
        kernel_resources(d.image(), "not_the_daemon")


def test_only_an_exact_match_is_found(tmp_path):
    policy = get_policy("dfccl")
    registers = register_cap(MAX_THREADS)
    daemon = ShippedDaemon("dfccl", MAX_THREADS, registers, (9, 0),
                           cache_key(policy, registers), "kernel", 9, "d.cubin")
    ship(daemon, b"\x7fELF one", tmp_path)
    assert find_shipped(policy, registers, (9, 0), tmp_path) == daemon
    assert find_shipped(policy, registers, (8, 0), tmp_path) is None        # another GPU
    assert find_shipped(policy, register_cap(256), (9, 0), tmp_path) is None  # a width
    changed = dataclasses.replace(policy, order_key=lambda params, priority, seq, coll: 0)
    assert find_shipped(changed, registers, (9, 0), tmp_path) is None       # its code
    # shipping again replaces the entry and the file
    ship(dataclasses.replace(daemon, entry="renamed"), b"\x7fELF two", tmp_path)
    assert [d.entry for d in shipped_daemons(tmp_path)] == ["renamed"]
    assert find_shipped(policy, registers, (9, 0), tmp_path).image(tmp_path) == b"\x7fELF two"


def test_the_runtime_takes_a_shipped_daemon_rather_than_compiling(monkeypatch):
    shipped = object()
    asked = []

    def shipped_daemon(policy, registers):
        asked.append((policy.name, registers))
        return shipped

    def no_compile(*args):
        raise AssertionError("compiled a daemon that was shipped")

    monkeypatch.setattr(backend, "kernels_on_host", False)
    monkeypatch.setattr(backend, "shipped_daemon", shipped_daemon)
    monkeypatch.setattr("pydfccl.kernels.daemon.make_daemon", no_compile)
    monkeypatch.setattr(daemons, "_daemons", {})
    policy = dataclasses.replace(get_policy("dfccl"), name="shipped-test")
    assert daemons.daemon_for(policy, MAX_THREADS) is shipped
    assert daemons.daemon_for(policy, MAX_THREADS) is shipped         # once a process
    assert asked == [("shipped-test", register_cap(MAX_THREADS))]


def test_without_a_shipped_daemon_the_runtime_compiles(monkeypatch):
    made = []
    monkeypatch.setattr(backend, "kernels_on_host", False)
    monkeypatch.setattr(backend, "shipped_daemon", lambda policy, registers: None)
    monkeypatch.setattr("pydfccl.kernels.daemon.make_daemon",
                        lambda policy, nthreads: made.append(nthreads) or "numba kernel")
    monkeypatch.setattr("pydfccl.kernels.daemon.compile_now", lambda kernel: None)
    monkeypatch.setattr(daemons, "_daemons", {})
    assert daemons.daemon_for(get_policy("dfccl"), 256) == "numba kernel"
    assert made == [256]


def test_the_shipped_files_are_package_data():
    """A wheel carries them: pyproject.toml's package data names every shipped file."""
    tomllib = pytest.importorskip("tomllib")        # Python 3.11 on
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["pydfccl.kernels"]
    files = [p.relative_to(SHIPPED_DIR.parent).as_posix() for p in SHIPPED_DIR.iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, pat) for pat in patterns) for f in files)
