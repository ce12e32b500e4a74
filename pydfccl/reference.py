"""What each collective must produce, computed with numpy: the demo and the tests check
the daemon against it. Inputs are reduced in float64 (or int64) and cast back, which is exact
for the small integers the checks use."""

from __future__ import annotations

import numpy as np

from .codes import KINDS

__all__ = ["buffer_elems", "reference"]

_REDUCE = {"sum": np.add, "avg": np.add, "prod": np.multiply, "max": np.maximum,
           "min": np.minimum}


def buffer_elems(kind: str, count: int, nranks: int) -> tuple[int, int]:
    """(send, recv) elements a run needs, with NCCL's meaning of ``count``."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective kind {kind!r}")
    if kind == "all_gather":
        return count, nranks * count
    if kind == "reduce_scatter":
        return nranks * count, count
    return count, count


def _reduce(inputs, op: str, dtype) -> np.ndarray:
    wide = np.int64 if np.issubdtype(dtype, np.integer) else np.float64
    out = inputs[0].astype(wide)
    for x in inputs[1:]:
        out = _REDUCE[op](out, x.astype(wide))
    if op == "avg":
        out = out // len(inputs) if wide is np.int64 else out / len(inputs)
    return out.astype(dtype)


def reference(kind: str, inputs: list, op: str = "sum", root: int = 0,
              rank: int = 0) -> np.ndarray | None:
    """Rank ``rank``'s expected output, given every rank's send buffer (``inputs[r]``);
    None where NCCL leaves it unspecified (reduce on a non-root rank)."""
    dtype = inputs[0].dtype
    n = len(inputs)
    if kind == "all_gather":
        return np.concatenate(inputs)
    if kind == "broadcast":
        return inputs[root].copy()
    if kind == "reduce" and rank != root:
        return None
    total = _reduce(inputs, op, dtype)
    if kind == "reduce_scatter":
        count = total.size // n
        return total[rank * count:(rank + 1) * count]
    return total
