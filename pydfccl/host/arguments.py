"""Integer arguments checked as the user gave them.

``isinstance(True, int)`` holds in Python and ``1.0 == 1``, so a flag or a float passed for a
count, a root or an id would otherwise be taken as a number without a word (``run(True,
x)`` would run collective 1). An argument that must be an integer is a Python or numpy
integer, not a bool and not a float, and the error names the argument.
"""

from __future__ import annotations

import numpy as np

__all__ = ["require_int"]


def require_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
                where: str = "") -> int:
    """``value`` as an int: ``TypeError`` unless it is an integer (bools and floats are
    not), ``ValueError`` outside ``minimum``..``maximum``. ``where`` prefixes the
    message (such as ``"collective 3: "``)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where}{name} must be an int, got {value!r} "
                        f"({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        wanted = "a non-negative int" if minimum == 0 else f"at least {minimum}"
        raise ValueError(f"{where}{name} must be {wanted}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{where}{name} must be at most {maximum}, got {value}")
    return value
