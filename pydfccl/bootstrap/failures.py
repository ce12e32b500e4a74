"""Which rank's failure to report when several failed: the one that failed first in cause,
not a peer that only saw the abort it caused."""

from __future__ import annotations

from ..errors import RankFailedError

__all__ = ["CONSEQUENCES", "raise_first"]

# Words in the first line of a failure that make it a consequence of another rank's.
CONSEQUENCES = ("DeadlockError", "AbortedError", "not every rank arrived",
                "still running after the job failed")


def raise_first(failures: dict) -> None:
    """Raise ``RankFailedError`` for the rank whose failure caused the others';
    ``failures`` maps rank -> (exception or None, text)."""
    origin = [r for r, (_, text) in failures.items()
              if not any(c in text.splitlines()[0] for c in CONSEQUENCES)]
    rank = min(origin or failures)
    exc, text = failures[rank]
    raise RankFailedError(rank, text) from exc
