"""Names users write, and the small integers the daemon reads instead."""

import ml_dtypes
import numpy as np

from .collectives import COLLECTIVES, collective

__all__ = ["KINDS", "POINT_TO_POINT", "COLLECTIVE_KINDS", "PER_PEER_COUNTS", "OUT_OF_PLACE_ONLY",
           "OPS", "DTYPES", "BFLOAT16", "kind_code", "op_code", "dtype_code", "normalize_dtype",
           "storage_dtype"]

KINDS = {c.name: c.code for c in COLLECTIVES}     # each kind is defined in collectives.py
POINT_TO_POINT = tuple(c.name for c in COLLECTIVES if c.point_to_point)   # with peer=
# one count for every run and every rank: the kinds the demo, soak and sweep draw from
COLLECTIVE_KINDS = tuple(c.name for c in COLLECTIVES
                         if not c.point_to_point and not c.per_peer_counts)
PER_PEER_COUNTS = tuple(c.name for c in COLLECTIVES if c.per_peer_counts)   # counts= a run
OUT_OF_PLACE_ONLY = tuple(c.name for c in COLLECTIVES if c.out_of_place_only)
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
# The codes are the daemon's dispatch (``move`` in kernels/primitives.py reads them).
DTYPES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3, "int8": 4, "uint8": 5,
          "float16": 6, "bfloat16": 7}

# numpy has no bfloat16: host arrays use ml_dtypes' (importing ml_dtypes also makes
# ``np.dtype("bfloat16")`` work). Numba cannot allocate or type it, so on the GPU bfloat16
# data lives in uint16 arrays of its raw bits, and the daemon converts with bit operations.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _lookup(table, value, what):
    try:
        return table[value]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {value!r}; supported: {sorted(table)}") from None


def kind_code(kind: str) -> int:
    return collective(kind).code


def op_code(op: str) -> int:
    return _lookup(OPS, op, "reduction op")


def normalize_dtype(dtype) -> np.dtype:
    """A numpy dtype from a name or dtype; ValueError if the daemon cannot reduce it."""
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", str(dtype))
    _lookup(DTYPES, name, "dtype")
    return np.dtype(name)


def storage_dtype(dtype) -> np.dtype:
    """The dtype of a GPU array holding ``dtype``'s elements: uint16 (raw bits) for
    bfloat16, which Numba cannot allocate, and the dtype itself otherwise."""
    dt = normalize_dtype(dtype)
    return np.dtype(np.uint16) if dt == BFLOAT16 else dt


def dtype_code(dtype) -> int:
    return DTYPES[normalize_dtype(dtype).name]
