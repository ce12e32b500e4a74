"""A stall reporter for programs that use pydfccl.torch: when a phase has lasted longer than
``seconds``, print what pydfccl knows (``status_report()``: each rank's collective and whom it
waits for) and every thread's stack, then exit with ``exit_code``. NCCL jobs hang instead;
PyTorch's own watchdog speaks only after its 10-minute timeout.

With ``PYDFCCL_STALL_NATIVE=1`` it also prints every thread's native stack through
``cuda-gdb`` or ``gdb`` (whichever is on the PATH), attached to this process: Python's stacks
stop at the call into a library, so they cannot say which CUDA call a thread waits in."""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable

__all__ = ["StallReporter"]


class StallReporter:
    """``enter(phase)`` whenever a phase begins; a phase that lasts ``seconds`` is
    reported. ``report`` says what the library knows (None: only the stacks)."""

    def __init__(self, rank: int, seconds: float, report: Callable[[], str] | None = None,
                 exit_code: int = 3, what: str = "the collectives deadlocked"):
        self.rank, self.seconds, self.report = rank, seconds, report
        self.exit_code, self.what = exit_code, what
        self.phase, self.since = "start", time.monotonic()
        threading.Thread(target=self._watch, name="pydfccl-stall-reporter", daemon=True).start()

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()

    def _watch(self) -> None:
        while True:
            time.sleep(0.5)
            stuck = time.monotonic() - self.since
            if stuck > self.seconds:
                print(f"STALL: rank {self.rank} stuck for {stuck:.0f} s in {self.phase}: "
                      f"{self.what}", file=sys.stderr, flush=True)
                if self.report is not None:
                    print(self.report(), file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                if os.environ.get("PYDFCCL_STALL_NATIVE") == "1":
                    print(native_stacks(), file=sys.stderr)
                sys.stderr.flush()
                os._exit(self.exit_code)


def native_stacks(pid: int | None = None, timeout: float = 120) -> str:
    """Every thread's native backtrace of process ``pid`` (default: this one), from a
    debugger attached for the moment; a line saying why when there is none."""
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if debugger is None:
        return "native stacks: neither cuda-gdb nor gdb is on the PATH"
    try:
        done = subprocess.run([debugger, "-p", str(pid or os.getpid()), "-batch", "-nx",
                               "-ex", "set pagination off", "-ex", "thread apply all bt 40"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"native stacks: {debugger} failed: {exc!r}"
    frames = [line for line in done.stdout.splitlines()
              if line.startswith(("Thread ", "#"))]
    return "native stacks:\n" + ("\n".join(frames) or done.stderr[-2000:])
