"""Which rank's failure to report when several failed: the one that failed first in cause,
not a peer that only saw the abort it caused."""

from __future__ import annotations

import re

from ..errors import RankFailedError

__all__ = ["CONSEQUENCES", "raise_first", "culprit"]

# Words in the first line of a failure that make it a consequence of another rank's.
CONSEQUENCES = ("DeadlockError", "AbortedError", "not every rank arrived",
                "still running after the job failed")

# How an abort report names the rank that caused it (watchdog, communicator, launchers).
_CAUSE = re.compile(r"\brank (\d+) (?:closed its communicator|failed\b)|"
                    r"rank failure: rank (\d+)\b")


def culprit(text: str) -> int | None:
    """The rank that an abort report in ``text`` names as its cause, if any."""
    found = _CAUSE.search(text)
    return None if found is None else int(found.group(1) or found.group(2))


def raise_first(failures: dict) -> None:
    """Raise ``RankFailedError`` for the rank whose failure caused the others';
    ``failures`` maps rank -> (exception or None, text). Where every failure is a
    consequence (the rank at fault returned, or closed its communicator early), the
    error is raised for the rank the abort report names."""
    origin = [r for r, (_, text) in failures.items()
              if not any(c in text.splitlines()[0] for c in CONSEQUENCES)]
    rank = min(origin or failures)
    exc, text = failures[rank]
    if not origin:
        named = culprit(text.splitlines()[0])
        if named is not None and named not in failures:
            raise RankFailedError(named, text) from exc
    raise RankFailedError(rank, text) from exc
