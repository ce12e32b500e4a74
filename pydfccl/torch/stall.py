"""A stall reporter for programs that use pydfccl.torch: when a phase has lasted longer than
``seconds``, print what pydfccl knows (``status_report()``: each rank's collective and whom it
waits for) and every thread's stack, then exit with ``exit_code``. NCCL jobs hang instead;
PyTorch's own watchdog speaks only after its 10-minute timeout."""

from __future__ import annotations

import faulthandler
import os
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
                sys.stderr.flush()
                os._exit(self.exit_code)
