"""A policy's parameters: each declared once, by name, with its GPU value and its kind.

The same policy runs on three backends whose clocks differ: the GPU (nanoseconds of
``%globaltimer``), the CPU simulator (nanoseconds of ``perf_counter_ns``, but a ring step
takes milliseconds there) and the model (ticks, one check of a step's condition). A
parameter's kind says how its GPU value carries over:

- ``time``: nanoseconds on the GPU, scaled by :data:`TIME_SCALES` for the other backends;
- ``count``: a number of tries, a factor, a bit shift: the same everywhere;
- ``flag``: 0 or 1, the same everywhere.

Where the scale is not what a backend needs, a parameter declares that backend's value
beside the GPU's (``Param.time(5_000_000, simulator=50_000_000, model=2_000)``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = [
    "NEVER",
    "GPU",
    "SIMULATOR",
    "MODEL",
    "BACKENDS",
    "TIME",
    "COUNT",
    "FLAG",
    "TIME_SCALES",
    "Param",
    "backend",
]

NEVER = 1 << 62  # a wait budget that is never reached

GPU, SIMULATOR, MODEL = "gpu", "simulator", "model"
BACKENDS = (GPU, SIMULATOR, MODEL)
TIME, COUNT, FLAG = "time", "count", "flag"

# A GPU time in nanoseconds times ``multiply // divide`` is the backend's. The simulator's
# steps take about a hundred times the GPU's; the model's tick stands for a microsecond.
TIME_SCALES = {GPU: (1, 1), SIMULATOR: (100, 1), MODEL: (1, 1000)}

_INT64 = (-(1 << 63), (1 << 63) - 1)


def backend(simulator: bool = False, model: bool = False) -> str:
    """The backend that ``param_array``'s flags name: the GPU unless one is set."""
    if simulator and model:
        raise ValueError("parameters are for the simulator or the model, not both")
    return SIMULATOR if simulator else MODEL if model else GPU


def _checked_int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what}: expected an integer, got {value!r}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise ValueError(f"{what}: {value} does not fit in int64")
    return value


@dataclass(frozen=True)
class Param:
    """One parameter: its GPU ``value``, its ``kind`` and, where given, the value the
    simulator or the model takes instead of the scaled one. Make one with
    :meth:`time`, :meth:`count` or :meth:`flag`."""

    value: int
    kind: str = COUNT
    simulator: Optional[int] = None
    model: Optional[int] = None

    def __post_init__(self):
        if self.kind not in (TIME, COUNT, FLAG):
            raise ValueError(f"unknown kind {self.kind!r}; known: time, count, flag")
        for where in BACKENDS:
            given = self.value if where == GPU else getattr(self, where)
            if given is None:
                continue
            _checked_int(given, f"{self.kind} parameter on the {where}")
            if self.kind == TIME and given < 0:
                raise ValueError(f"a time cannot be negative, got {given} on the {where}")
            if self.kind == FLAG and given not in (0, 1):
                raise ValueError(f"a flag is 0 or 1, got {given} on the {where}")

    @classmethod
    def time(cls, ns: int, *, simulator: Optional[int] = None,
             model: Optional[int] = None) -> "Param":
        """A time: ``ns`` nanoseconds on the GPU, scaled elsewhere unless given there
        (``simulator`` in nanoseconds, ``model`` in ticks)."""
        return cls(ns, TIME, simulator, model)

    @classmethod
    def count(cls, n: int, *, simulator: Optional[int] = None,
              model: Optional[int] = None) -> "Param":
        """A number that means the same on every backend unless given there."""
        return cls(n, COUNT, simulator, model)

    @classmethod
    def flag(cls, on) -> "Param":
        """0 or 1 on every backend."""
        return cls(int(on) if isinstance(on, bool) else on, FLAG)

    @classmethod
    def fixed(cls, value: int, kind: str = COUNT) -> "Param":
        """``value`` as is on every backend (what ``Policy.with_params`` makes of an
        integer override)."""
        return cls(value, kind, value, value)

    def on(self, where: str) -> int:
        """The value on backend ``where`` (``GPU``, ``SIMULATOR`` or ``MODEL``)."""
        if where not in BACKENDS:
            raise ValueError(f"unknown backend {where!r}; known: {list(BACKENDS)}")
        given = None if where == GPU else getattr(self, where)
        if given is not None:
            return given
        if self.kind != TIME or self.value >= NEVER:   # never is never everywhere
            return self.value
        multiply, divide = TIME_SCALES[where]
        scaled = self.value * multiply // divide
        if self.value > 0:
            scaled = max(scaled, 1)                    # a budget does not vanish
        return min(scaled, _INT64[1])
