"""The launcher: keeps a rank's daemon kernel on the GPU whenever the rank has work undone.

The daemon quits by itself when its policy says the rank has gone too long without progress
(idle, or stuck behind peers): that is how device synchronizations finish under pydfccl. A
thread per rank relaunches it when runs are undone, at once if the last launch made
progress, else after a pause that doubles up to 10 ms unless something changes on any rank
(a submission, a step): a device sync that waits for every kernel completes in that gap.

Its state is one value (``LaunchState``), changed under the communicator's lock. The rule
it keeps, checked at every change and from the poller (``check``): *work undone implies a
launch on its way, running, or paused for a bounded time*. A state that breaks it raises
``LauncherError`` instead of leaving peers to wait for a daemon that nobody will launch.

Nothing outside pydfccl ever waits on the GPU for a collective (``pydfccl.torch`` waits
on the host), so a relaunch never waits behind work that waits for the daemon.
"""

from __future__ import annotations

import collections
import enum
import threading
import time
from contextlib import nullcontext

import numpy as np

from .. import platform
from ..platform import backend
from ..errors import PydfcclError
from ..log import logger

__all__ = ["LaunchState", "Launcher", "LauncherError"]

MAX_PAUSE = 0.01          # the longest wait before relaunching a daemon that quit stuck
IDLE_LOOK = 0.05          # how often an idle launcher looks again without being woken
LOST_AFTER = 1.0          # work owed this long to a launch thread that looks: a lost launch
STARVED_AFTER = 60.0      # ... or owed this long to one that has not looked since
LAUNCH_CALL_WARN = 5.0    # a launch call that takes this long is named in status()


class LauncherError(PydfcclError):
    """The launcher broke its rule: work undone and no daemon on its way."""


class LaunchState(enum.Enum):
    IDLE = "idle"              # no launch, nothing undone
    LAUNCHING = "launching"    # decided; the launch call is being made
    RUNNING = "running"        # on the stream until the stream is idle
    PAUSED = "paused"          # the daemon quit stuck with work undone: relaunch after a pause
    STOPPED = "stopped"        # the communicator closed or aborted


class Launcher:
    """The launches of one rank's daemon.

    ``lock`` is the communicator's lock; ``undone()`` (called with it held) counts the runs
    the daemon must still finish; ``activity()`` changes whenever any rank submits or makes
    progress; ``running()`` says whether the communicator still wants a daemon. ``launch``
    is ``(configured kernel, arguments)`` for ``platform.launch``; ``quits`` is False for a
    policy whose daemon never quits (device frees are then held while it runs);
    ``on_error(exc)`` fails the communicator when a launch fails or the rule breaks."""

    def __init__(self, rank: int, lock: threading.Lock, undone, activity, running, stream,
                 launch: tuple, quits: bool, on_error):
        self.rank = rank
        self._on_error = on_error
        self._cond = threading.Condition(lock)
        self._undone, self._activity, self._running = undone, activity, running
        self._stream = stream
        self._configured, self._args = launch
        self._quits = quits
        self.state = LaunchState.IDLE
        self._since = time.monotonic()
        self.launches = 0
        self._waiters = 0
        self._frees_held = None       # the launch-per-call baseline's hold on Numba's frees
        self._log: collections.deque = collections.deque(maxlen=24)
        self._owed = None      # (state's since, first seen) of an idle state with work out
        self._looked = 0.0     # when the launch thread last weighed whether to launch
        self._thread: threading.Thread | None = None

    # -- state -----------------------------------------------------------------------------

    def _set(self, state: LaunchState, why: str) -> None:
        """Change state (lock held), log it, and check the rule."""
        self.state, self._since = state, time.monotonic()
        self._log.append((time.monotonic_ns(), f"{state.value}: {why}"))
        if state is LaunchState.IDLE and self._running() and self._undone():
            raise LauncherError(f"rank {self.rank}: the launcher went idle with "
                                f"{self._undone()} run(s) undone")
        self._cond.notify_all()

    def check(self) -> None:
        """The rule, from outside the launch thread (the poller calls it while work is out):
        a launcher whose thread died, or that has stayed idle or paused with work undone
        while its thread looked again and again for a second, has lost a launch. A thread
        that has not looked since the work came is starved of the CPU or the GIL (a loaded
        machine), not wrong: it is given a minute. Raises ``LauncherError``."""
        with self._cond:
            if self.state is LaunchState.STOPPED or not self._running():
                return
            undone, now = self._undone(), time.monotonic()
            if self._thread is not None and not self._thread.is_alive():
                raise LauncherError(f"rank {self.rank}: {undone} run(s) undone and the "
                                    "launch thread has ended")
            if not undone or self.state not in (LaunchState.IDLE, LaunchState.PAUSED):
                self._owed = None
                return
            if self._owed is None or self._owed[0] != self._since:
                self._owed = (self._since, now)     # first seen so in this state
                return
            owed_for = now - self._owed[1]
            looking = self._thread is None or self._looked - self._owed[1] > LOST_AFTER
            if (owed_for > LOST_AFTER and looking) or owed_for > STARVED_AFTER:
                raise LauncherError(
                    f"rank {self.rank}: {undone} run(s) undone and no daemon on its way "
                    f"(launcher {self.state.value} for {now - self._since:.1f} s, with work "
                    f"for {owed_for:.1f} s; its thread last looked "
                    f"{now - self._looked:.1f} s ago)")

    def view(self) -> dict:
        """What ``Communicator.status()`` shows of the launches (lock held)."""
        seconds = time.monotonic() - self._since
        view = dict(state=self.state.value, for_s=round(seconds, 3), launches=self.launches)
        if self.state is LaunchState.LAUNCHING and seconds > LAUNCH_CALL_WARN:
            view["note"] = ("the launch call has not returned: a CUDA call of this process "
                            "that waits for the whole device blocks it")
        return view

    def log(self) -> list[str]:
        """The latest state changes, newest last, as times relative to now (lock held)."""
        now = time.monotonic_ns()
        return [f"{(t - now) / 1e6:+.3f} ms {what}" for t, what in self._log]

    def notify(self) -> None:
        """New work (lock held): wake the launch thread if it waits."""
        if self._waiters:
            self._cond.notify_all()

    def _wait(self, timeout: float) -> None:
        self._waiters += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._waiters -= 1

    # -- the persistent daemon ---------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"pydfccl-r{self.rank}-launcher",
                                        daemon=True)
        self._thread.start()

    def _due(self, pause: float, paused_at: float, activity) -> bool:
        return (pause == 0 or self._activity() != activity
                or time.perf_counter() - paused_at >= pause)

    def _loop(self) -> None:
        platform.bind_thread()
        pause, activity, paused_at = 0.0, None, 0.0
        try:
            while True:
                with self._cond:
                    while True:
                        if not self._running():
                            self._set(LaunchState.STOPPED, "communicator stopped")
                            return
                        undone, self._looked = self._undone(), time.monotonic()
                        if undone and self._due(pause, paused_at, activity):
                            break
                        if not undone and self.state is not LaunchState.IDLE:
                            self._set(LaunchState.IDLE, "nothing undone")
                        self._wait(min(pause, 2e-4) if undone else IDLE_LOOK)
                    self.launches += 1
                    # a launch that runs the kernel on this thread: running from the call on
                    self._set(LaunchState.RUNNING if backend.launch_runs_kernel
                              else LaunchState.LAUNCHING,
                              f"launch {self.launches}, {undone} undone")
                before = self._activity()
                with platform.deferred_frees() if not self._quits else nullcontext():
                    platform.launch(self._configured, self._args)
                    if not backend.launch_runs_kernel:
                        with self._cond:
                            self._set(LaunchState.RUNNING, "on the stream")
                    platform.wait_stream(self._stream)
                activity = self._activity()
                pause = min(max(2 * pause, 2e-4), MAX_PAUSE) if activity == before else 0.0
                with self._cond:
                    if self._undone():
                        paused_at = time.perf_counter()
                        self._set(LaunchState.PAUSED, f"quit stuck, pause {pause * 1e3:.1f} ms"
                                  if pause else "quit with work undone, progressed")
                    else:
                        self._set(LaunchState.IDLE, "quit, nothing undone")
                logger.debug("rank %d: daemon quit (launch %d, pause %.1f ms)", self.rank,
                             self.launches, pause * 1e3)
        except Exception as exc:    # a failed launch fails the futures; it must not vanish
            with self._cond:
                self.state = LaunchState.STOPPED
                self._cond.notify_all()
            self._on_error(exc if isinstance(exc, LauncherError) else PydfcclError(
                f"rank {self.rank}: daemon launch failed: {exc!r}"))

    def wait_on_stream(self, stop) -> int:
        """Wait (lock held) until work undone has its launch on the stream, as a device sync
        must come after the launch of the work submitted before it; returns the launch
        count, for ``wait_for_launch_end``. ``stop()`` ends the wait early."""
        while (self._undone() and self.state not in (LaunchState.RUNNING,
                                                     LaunchState.STOPPED) and not stop()):
            self._wait(0.01)
        return self.launches

    def wait_for_launch_end(self, generation: int, stop) -> None:
        """Wait (lock held) until the launch ``generation`` that is running has ended: what a
        device sync waits for on the simulator, where a launch runs on the launch thread."""
        while (self.state is LaunchState.RUNNING and self.launches == generation
               and not stop()):
            self._wait(0.01)

    def stop(self) -> None:
        """Wake the launch thread so that it sees the communicator stopped, and join it."""
        with self._cond:
            self._let_frees_go()
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    @property
    def thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the launch-per-call baseline --------------------------------------------------------

    def launch_once(self, limit: int) -> None:
        """The launch-per-collective baseline's kernel for the runs submitted so far
        (``limit``). Like NCCL's, it spins until every peer's kernel has arrived, and a
        device free waits for every kernel, so Numba's frees are held while this rank has
        runs outstanding (``all_done`` lets them go). The launch takes the runs submitted so
        far, no more: its blocks each read the SQ when they look, and blocks of one launch
        that took different runs would deadlock the ring."""
        with self._cond:
            if self._frees_held is None:
                self._frees_held = platform.deferred_frees()
                self._frees_held.__enter__()
        platform.launch(self._configured, self._args[:-1] + (np.int64(limit),))
        self.launches += 1

    def all_done(self) -> None:
        """The baseline has nothing outstanding (lock held): no kernel of this rank waits for
        a peer, so device frees may go."""
        self._let_frees_go()

    def _let_frees_go(self) -> None:
        if self._frees_held is not None:
            self._frees_held.__exit__(None, None, None)
            self._frees_held = None

    @property
    def frees_held(self) -> bool:
        return self._frees_held is not None
