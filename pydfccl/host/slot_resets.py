"""The device writes of shared slots (``shared_slots.py``), on a thread of their own.

A slot bound anew is reset in the rank's pool (device memory) before the rank says so. The
poller, which sees the binding, must never wait on the device (``host/poller.py``: a
device copy can wait behind the application's streams), so it hands the writes to this
thread, one per process, which makes them in order and then calls the job's ``then``
(the acknowledgement in the control row) and wakes the poller.
"""

from __future__ import annotations

import atexit
import queue
import threading

from .. import platform
from ..log import logger
from .poller import poller

__all__ = ["resets"]


class Resets:
    """``put(writes, then)``: call ``writes()``, then ``then()``, on the resets thread."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopping = False

    def put(self, writes, then) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="pydfccl-slots",
                                                daemon=True)
                self._thread.start()
        self._jobs.put((writes, then))

    def _loop(self) -> None:
        platform.bind_thread()
        while not self._stopping:
            job = self._jobs.get()
            if job is None:
                break
            writes, then = job
            try:
                writes()
            except Exception as exc:     # the slot is never acknowledged: runs stay held
                logger.warning("resetting a shared slot failed: %r", exc)
                continue
            then()
            poller.wake()

    def shutdown(self) -> None:
        """At interpreter exit, before numba-cuda frees device memory (as the poller's)."""
        self._stopping = True
        self._jobs.put(None)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)


resets = Resets()
atexit.register(resets.shutdown)
