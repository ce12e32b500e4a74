"""``demo --status-every SECONDS``: what every rank is doing, in the words a user reads
(outstanding runs, the collective each daemon block is on and whom it waits for, the host
in a device sync, preemptions so far), printed by a thread at that interval for the whole
run and once when the printing rank is done, so that a run shorter than the interval still
shows one. That last one may find other ranks still finishing their last runs."""

from __future__ import annotations

import sys
import threading

from ..host.watchdog import format_status

__all__ = ["StatusPrinter"]


class StatusPrinter:
    """A thread that prints ``format_status(comm.status(), internals=False)`` every
    ``every`` seconds from ``start()`` until ``stop()``, which prints it once more."""

    def __init__(self, comm, every: float, out=None):
        self.comm, self.every = comm, every
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"pydfccl-status-r{comm.rank}")

    def _print(self, when: str) -> bool:
        """Print the status; False once there is none to read (the communicator closed)."""
        try:
            text = format_status(self.comm.status(), internals=False)
        except Exception:
            return False
        print(f"status ({when}):\n{text}", file=self.out, flush=True)
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            if not self._print("running"):
                return

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._print(f"rank {self.comm.rank} done")
