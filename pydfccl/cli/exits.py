"""The command line's expected failures: raised anywhere below a subcommand, they become one
line on stderr and an exit status (``pydfccl.cli.main``), never a traceback. Anything else
is unexpected and keeps its traceback."""

from __future__ import annotations

__all__ = ["EXIT_USAGE", "CommandError", "UsageError"]

EXIT_USAGE = 2      # as argparse exits on a bad argument


class CommandError(Exception):
    """A failure the user can act on; ``status`` is the exit status it ends with."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


class UsageError(CommandError):
    """A bad argument or input file: exit status 2."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_USAGE)
