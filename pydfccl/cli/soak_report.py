"""What a soak found: the runs submitted, completed, verified and wrong, the schedules that
failed, what the engine did (preemptions, relaunches, device syncs), and the process's
footprint along the way; its verdict in one line."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from .options import policy_name
from .soak_resources import grown_types, resource_table
from .soak_schedules import Schedule, SoakOptions

__all__ = ["SoakReport", "summarize"]


@dataclass
class SoakReport:
    schedules: int = 0
    submitted: int = 0          # runs the workers submitted, all ranks together
    completed: int = 0          # runs the communicators completed
    verified: int = 0
    wrong: list = field(default_factory=list)
    failures: list = field(default_factory=list)    # schedules whose launch failed
    bad_schedules: list = field(default_factory=list)   # indices: failed or a wrong output
    preemptions: int = 0
    relaunches: int = 0
    syncs: int = 0
    dropped_buffers: int = 0
    seconds: float = 0.0
    resources: list = field(default_factory=list)   # ResourceSample, 1, 2, 4, ... schedules in

    @property
    def lost(self) -> int:
        return self.submitted - self.completed

    def verdict(self) -> str | None:
        """Why the run failed, in one line; None when every output verified and no run was
        lost."""
        reasons = []
        if self.failures:
            reasons.append(f"schedule {self.bad_schedules[-1]} failed")
        if self.wrong:
            reasons.append(f"{len(self.wrong)} wrong results")
        if self.lost:
            reasons.append(f"{self.lost} runs lost (submitted but never completed)")
        if not self.schedules and not self.failures:
            reasons.append("no schedule ran")
        return "; ".join(reasons) or None

    def add(self, schedule: Schedule, per_rank: list) -> None:
        self.schedules += 1
        self.syncs += sum(len(s) for s in schedule.syncs)
        if any(out["wrong"] for out in per_rank):
            self.bad_schedules.append(schedule.index)
        for out in per_rank:
            self.submitted += out["submitted"]
            self.verified += out["verified"]
            self.wrong += out["wrong"]
            stats = out["stats"]
            self.completed += stats["completed"]
            self.preemptions += stats["preemptions"]
            self.relaunches += stats["relaunches"]
            self.dropped_buffers += stats["dropped_buffers"]


def summarize(report: SoakReport, opts: SoakOptions, where: str) -> str:
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss << 10
    resources = "resources of this process:\n" + resource_table(report.resources)
    if children:
        resources += f"\n  (largest child process, a rank process: {children / (1 << 20):.1f} MiB)"
    if len(report.resources) > 2:   # from the first schedule's end (imports done) to the end
        first, last = report.resources[1], report.resources[-1]
        per = (last.objects - first.objects) / max(1, report.schedules - 1)
        resources += (f"\n  from the first schedule to the end: threads {first.threads} -> "
                      f"{last.threads}, objects {first.objects} -> {last.objects} ({per:+.2f} "
                      f"a schedule); types grown most: {grown_types(first, last)}; "
                      f"classes made: {grown_types(first, last, 4, classes=True)}")
    return "\n".join([
        f"soak on the {where}: {report.schedules} schedule{'s' * (report.schedules != 1)} "
        f"(seed {opts.seed}, policy {policy_name(opts.policy)}) in {report.seconds:.1f} s",
        f"runs: {report.submitted} submitted on all ranks, {report.completed} completed, "
        f"{report.lost} lost; outputs verified: {report.verified} (a reduce only at its "
        f"root), wrong: {len(report.wrong)}",
        f"preemptions: {report.preemptions}; relaunches: {report.relaunches}; device syncs: "
        f"{report.syncs}; dropped buffers: {report.dropped_buffers}",
        resources,
    ])
