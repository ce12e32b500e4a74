"""The hot path's divisions (kernels/divide.py) give Python's results on both sides of the
32-bit fast path (as Python here; the GPU runs them in every collective's plan and move,
tests/ranks/test_collectives.py on the device)."""

from pydfccl.kernels.divide import quotient, remainder

CASES = [(0, 1), (7, 2), (16, 3), (131072, 4), (2**32 - 1, 7), (2**32 - 1, 2**32 - 1),
         (2**32, 3), (2**32 + 5, 2**32), (2**40 + 123, 1000), (12345, 2**33),
         (2**62 + 1, 3)]


def test_quotient_and_remainder_match_python_on_both_paths():
    for a, b in CASES:
        assert quotient.py_func(a, b) == a // b, (a, b)
        assert remainder.py_func(a, b) == a % b, (a, b)
