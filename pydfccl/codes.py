"""Names users write, and the small integers the daemon reads instead."""

import numpy as np

__all__ = ["KINDS", "OPS", "DTYPES", "kind_code", "op_code", "dtype_code", "normalize_dtype"]

KINDS = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "broadcast": 3, "reduce": 4}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
# The order is the daemon's dispatch order; keep it in step with kernels/reduce.py.
DTYPES = {"float32": 0, "float64": 1, "int32": 2, "int64": 3, "int8": 4, "uint8": 5}

PLANNED_KINDS = ("send", "recv", "all_to_all")
PLANNED_DTYPES = ("float16", "bfloat16")


def _lookup(table, value, what, planned=()):
    try:
        return table[value]
    except (KeyError, TypeError):
        hint = f" ({value!r} is not implemented yet)" if value in planned else ""
        raise ValueError(f"unknown {what} {value!r}{hint}; supported: {sorted(table)}") from None


def kind_code(kind: str) -> int:
    return _lookup(KINDS, kind, "collective kind", PLANNED_KINDS)


def op_code(op: str) -> int:
    return _lookup(OPS, op, "reduction op")


def normalize_dtype(dtype) -> np.dtype:
    """A numpy dtype from a name or dtype; ValueError if the daemon cannot reduce it."""
    name = dtype if isinstance(dtype, str) else getattr(np.dtype(dtype), "name", str(dtype))
    _lookup(DTYPES, name, "dtype", PLANNED_DTYPES)
    return np.dtype(name)


def dtype_code(dtype) -> int:
    return DTYPES[normalize_dtype(dtype).name]
