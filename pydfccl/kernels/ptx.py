"""Compile the daemon to PTX without a GPU, and check what the simulator cannot.

The simulator hides typing errors (it runs Python) and memory-ordering bugs (it re-reads
memory every time), so CI also compiles every daemon for sm_90 with libNVVM and checks
that each spin loop polls with an ordered load (acquire or volatile) rather than a plain
load that LLVM may hoist out of the loop.
"""

from __future__ import annotations

import re

__all__ = ["daemon_ptx", "spin_loops", "unordered_spin_loops"]


def daemon_ptx(policy="dfccl", cc=(9, 0)) -> str:
    """The PTX of ``policy``'s daemon kernel for compute capability ``cc``."""
    from numba import cuda

    from ..sched.policies import get_policy
    from .ahead import offline_device
    from .daemon import DAEMON_SIGNATURE, make_daemon

    kernel = make_daemon(get_policy(policy))
    with offline_device(cc):
        ptx, _ = cuda.compile_ptx(kernel.py_func, DAEMON_SIGNATURE, cc=cc)
    return ptx


_LABEL = re.compile(r"^\s*(\$?[\w$]+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$?[\w$]+);")


def spin_loops(ptx: str) -> list[list[str]]:
    """Bodies of the backward branches that contain a ``nanosleep`` (the wait loops)."""
    lines = ptx.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        m = _LABEL.match(line)
        if m:
            labels[m.group(1)] = i
    loops = []
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            body = lines[labels[m.group(1)]: i + 1]
            if any("nanosleep" in b for b in body):
                loops.append(body)
    return loops


def unordered_spin_loops(ptx: str) -> list[list[str]]:
    """Wait loops whose only global loads are plain (hoistable) ones: should be empty."""
    bad = []
    for body in spin_loops(ptx):
        text = "\n".join(body)
        if not re.search(r"ld\.(acquire|volatile|relaxed)", text):
            bad.append(body)
    return bad
