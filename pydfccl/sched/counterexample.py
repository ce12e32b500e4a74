"""A counterexample file: everything a model run needs to happen again, anywhere.

A failing property test, ``check-policy`` and ``risk`` searches print or write one; ``python
-m pydfccl replay FILE`` runs it in the model and on the engine and shows both verdicts.
The JSON::

    {"format": "pydfccl-counterexample", "version": 1,
     "schedule": {"nranks": 2, "collectives": {...}, "ranks": [...]},
     "policy": "mypolicies:halving",
     "params": {"BASE": 5, "QUIT_AFTER": 40},
     "options": {"nslots": 2, "slot_elems": 1, "one_shot_elems": 0, "relaunch_ticks": 1,
                 "seed": 7, "start_ticks": null},
     "seed": 0,
     "model": "livelock after 95306 ticks: ..."}

``policy`` is what ``--policy`` takes (a registered name or ``package.module:name``),
``params`` the overrides as ``Policy.with_params`` takes them (an integer holds as given on
every backend), ``options`` the keyword options of ``run_schedule``, ``seed`` the search's
(what drew the example) and ``model`` what the model said when the file was written. A bare
schedule (``Schedule.to_json()``) loads too, with the defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Optional

from .schedule import Result, Schedule

__all__ = ["FORMAT", "RUN_OPTIONS", "Counterexample", "load_counterexample"]

FORMAT = "pydfccl-counterexample"
RUN_OPTIONS = ("nslots", "slot_elems", "one_shot_elems", "relaunch_ticks", "seed",
               "start_ticks", "max_quiet_ticks")


@dataclass(frozen=True)
class Counterexample:
    """A schedule with the policy, parameters and run options that made it fail."""

    schedule: Schedule
    policy: str = "dfccl"
    params: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    seed: Optional[int] = None
    model: Optional[str] = None

    def __post_init__(self):
        unknown = set(self.options) - set(RUN_OPTIONS)
        if unknown:
            raise ValueError(f"unknown run option(s) {sorted(unknown)}; known: "
                             f"{list(RUN_OPTIONS)}")
        for name, value in self.params.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"parameter {name}={value!r}: expected an integer")

    @classmethod
    def of(cls, schedule: Schedule, policy, params: Optional[dict] = None,
           options: Optional[dict] = None, seed: Optional[int] = None) -> "Counterexample":
        """One for ``policy`` (a name or a Policy; a Policy's integer overrides are taken
        from its model values where they differ from the registered policy's)."""
        from .plugins import spec_of
        from .policies import Policy, get_policy

        params = dict(params or {})
        if isinstance(policy, Policy):
            spec = spec_of(policy)
            try:
                base = get_policy(spec).values(model=True)
            except ValueError:
                base = {}
            for name, value in policy.values(model=True).items():
                if base.get(name) != value:
                    params.setdefault(name, value)
            policy = spec
        return cls(schedule, policy, params, dict(options or {}), seed)

    def policy_object(self, policy: Optional[str] = None, params: Optional[dict] = None):
        """The policy with the file's overrides, then ``params`` on top; ``policy``
        replaces the file's."""
        from .policies import get_policy

        return get_policy(policy or self.policy).with_params(**{**self.params,
                                                                **(params or {})})

    def run_model(self, policy: Optional[str] = None,
                  params: Optional[dict] = None) -> Result:
        """What the model says, with the file's options."""
        from .model import run_schedule

        return run_schedule(self.schedule, self.policy_object(policy, params), **self.options)

    def with_model(self) -> "Counterexample":
        """The same, with ``model`` set to what the model says now."""
        return replace(self, model=self.run_model().summary())

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": 1, "schedule": self.schedule.to_dict(),
                "policy": self.policy, "params": dict(self.params),
                "options": dict(self.options), "seed": self.seed, "model": self.model}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def save(self, path) -> None:
        with open(path, "w") as f:
            f.write(self.to_json() + "\n")

    @classmethod
    def from_dict(cls, data: dict) -> "Counterexample":
        if "schedule" not in data:                    # a bare schedule
            return cls(Schedule.from_dict(data))
        if data.get("format", FORMAT) != FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {FORMAT!r}")
        return cls(Schedule.from_dict(data["schedule"]), str(data.get("policy", "dfccl")),
                   dict(data.get("params") or {}), dict(data.get("options") or {}),
                   data.get("seed"), data.get("model"))


def load_counterexample(source) -> Counterexample:
    """A Counterexample from itself, a dict, JSON text or a file path; ValueError when it
    is not one (nor a bare schedule), OSError when the file cannot be read."""
    if isinstance(source, Counterexample):
        return source
    if isinstance(source, dict):
        data = source
    else:
        text = str(source).strip()
        if not text.startswith("{"):
            with open(source) as f:
                text = f.read()
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from None
    try:
        return Counterexample.from_dict(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a counterexample ({type(exc).__name__}: {exc})") from None
