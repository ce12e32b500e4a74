"""Exceptions raised by pydfccl; all derive from ``PydfcclError``."""

__all__ = ["PydfcclError", "DeadlockError", "AbortedError", "RankFailedError", "SpansHostsError"]


class PydfcclError(RuntimeError):
    """Base class of pydfccl's runtime errors."""


class DeadlockError(PydfcclError):
    """The watchdog saw no progress while collectives were outstanding.

    ``report`` names what each rank waits on and the wait-for cycle, when there is one.
    """

    def __init__(self, report: str):
        super().__init__(report)
        self.report = report


class AbortedError(PydfcclError):
    """The communicator was aborted (closed, or a peer failed) before a collective finished."""


class RankFailedError(PydfcclError):
    """A worker raised, or a rank process died; ``rank`` names it."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank}: {message}")
        self.rank = rank


class SpansHostsError(PydfcclError):
    """The ranks of a communicator run on more than one host; the message names each host's
    ranks. A world's ranks share memory, which does not reach another host."""
