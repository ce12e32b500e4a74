"""Waiting in a test for something another thread does, with a bound generous enough for a
loaded machine: a condition that never comes true fails the test's assert, not the run."""

import time

__all__ = ["wait_until"]


def wait_until(condition, seconds: float = 60.0) -> bool:
    """Whether ``condition()`` came true within ``seconds`` (looked at every 5 ms)."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()
