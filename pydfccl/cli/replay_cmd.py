"""``python -m pydfccl replay FILE``: a counterexample in the model and on the engine.

FILE is a counterexample file (:mod:`pydfccl.sched.counterexample`: schedule, policy,
parameters, run options, seed) or a bare schedule. The model runs it twice, with the
file's options (as it was found) and with the engine's slot sizes (as the engine runs it:
:func:`pydfccl.cli.replay.predict`), and the engine runs it on every rank
(:func:`pydfccl.cli.replay.replay`); the three verdicts print side by side. Exit 0 when the
model (at the engine's slot sizes) and the engine both complete, 3 when both deadlock, 4
when they disagree, 2 on a bad argument or file.
"""

from __future__ import annotations

import argparse

from ..errors import RankFailedError
from ..host.world_config import on_gpu
from ..sched.choice import parse_params
from ..sched.counterexample import load_counterexample
from . import replay as engine_replay
from .exits import UsageError
from .options import check_backend, policy_label

__all__ = ["build_parser", "main"]

EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    gpu = on_gpu()
    p = argparse.ArgumentParser(prog="python -m pydfccl replay",
                                description=__doc__.split("\n")[0].split(": ", 1)[1])
    p.add_argument("file", metavar="FILE", help="a counterexample file or a schedule (JSON)")
    p.add_argument("--policy", default=None, metavar="POLICY",
                   help="run this policy instead of the file's (a name or package.module:name)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="override a parameter, on top of the file's (repeatable)")
    p.add_argument("-d", "--dtype", default="float32", choices=engine_replay.DTYPES)
    p.add_argument("--backend", choices=("threads", "processes"), default=None)
    p.add_argument("--watchdog", type=float, default=5.0 if gpu else 30.0,
                   help="seconds without progress before the engine reports a deadlock")
    p.add_argument("--model-only", action="store_true", help="do not run the engine")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        found = load_counterexample(args.file)
        engine_replay.check_replayable(found.schedule, args.dtype)
        overrides = parse_params(args.param)
        policy = found.policy_object(args.policy, overrides)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{args.file}: {exc}") from None
    spec = args.policy or found.policy
    label = policy_label(spec, {**found.params, **overrides})
    schedule = found.schedule
    print(f"replay {args.file}: {schedule.nranks} ranks, {len(schedule.collectives)} "
          f"all-reduces of {args.dtype}, policy {label}"
          + (f", found with seed {found.seed}" if found.seed is not None else ""))
    as_found = found.run_model(args.policy, overrides)
    print(f"  model, the file's options:   {as_found.summary()}")
    if args.model_only:
        return engine_replay.EXIT_COMPLETED if as_found.outcome == "completed" else \
            engine_replay.EXIT_DEADLOCK
    check_backend(args.backend)
    try:
        compared = engine_replay.replay_against_model(
            schedule, policy, args.dtype, args.backend, watchdog_timeout=args.watchdog,
            options=found.options)
    except RankFailedError as exc:
        print(f"FAILED: {exc}")
        return EXIT_FAILED
    where = "GPU" if on_gpu() else "CUDA simulator"
    print(f"  model, the engine's slots:   {compared.model.summary()}")
    print(f"  engine ({where}):{' ' * max(1, 14 - len(where))}"
          f"{engine_replay.engine_summary(compared)}")
    engine = compared.outcome["outcome"]
    if engine_replay.agree(compared):
        print(f"verdicts agree: {engine}")
    else:
        print(f"verdicts DISAGREE: the model says {compared.model.outcome}, the engine "
              f"{engine}")
    return engine_replay.exit_status(compared)
