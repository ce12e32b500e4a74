"""This process's footprint, sampled as a soak runs: threads, resident memory, the objects
the garbage collector tracks (by type) and the GPU's memory in use. A leak grows them, a
cache levels off."""

from __future__ import annotations

import collections
import gc
import resource
import threading
from dataclasses import dataclass, field

from .. import platform

__all__ = ["ResourceSample", "resource_sample", "grown_types", "resource_table"]


@dataclass(frozen=True)
class ResourceSample:
    """This process's footprint at one moment: a leak grows these, a cache levels off."""
    when: str
    threads: int
    rss: int                    # resident bytes
    objects: int                # objects Python's garbage collector tracks
    device_used: int | None     # the GPU's memory in use (None under the simulator)
    layouts: int = 0            # entries of Numba's layout cache emptied before this sample
    types: collections.Counter = field(default_factory=collections.Counter, compare=False,
                                       repr=False)   # tracked objects by type name


def resource_sample(when: str) -> ResourceSample:
    """Measure now. RSS is VmRSS where /proc has it, else the peak (``ru_maxrss``, KiB on
    Linux). Numba's layout cache is emptied first (``platform.clear_layout_cache``): it
    grows with every new array size, and the soak's sizes are random, so what still grows
    is pydfccl's. The frees Numba holds back are made, and the garbage collected, first:
    otherwise the device reading swings with the queue of frees (by gigabytes on a GPU) and
    the object count with uncollected cycles."""
    layouts = platform.clear_layout_cache()
    platform.flush_frees()
    gc.collect()
    try:
        with open("/proc/self/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    objects = gc.get_objects()
    types = collections.Counter(_type_name(o) for o in objects)
    return ResourceSample(when, threading.active_count(), rss * 1024, len(objects),
                          platform.device_memory_used(), layouts, types)


def _type_name(obj) -> str:
    """What counts ``obj`` in a sample: its type's name, and for a class the module that
    made it (a class made anew for every schedule is a leak that type names alone hide)."""
    kind = type(obj)
    if kind is type:
        return f"type ({getattr(obj, '__module__', '?')})"
    return kind.__qualname__


def grown_types(first: ResourceSample, last: ResourceSample, top: int = 6,
                classes: bool = False) -> str:
    """The object types whose count grew most between two samples: where a leak lives.
    With ``classes``, only the classes made, by the module that made them."""
    growth = [(name, n) for name, n in (last.types - first.types).most_common()
              if name not in ("ResourceSample", "Counter")   # the samples themselves
              and (not classes or name.startswith("type ("))][:top]
    return ", ".join(f"{name} +{n}" for name, n in growth) or "none"


def resource_table(samples: list) -> str:
    """One line per sample, aligned."""
    mib = 1 << 20
    lines = [f"  {'when':<24} {'threads':>7} {'RSS MiB':>9} {'objects':>9} {'GPU MiB':>9} "
             f"{'layouts':>8}"]
    for s in samples:
        device = "-" if s.device_used is None else f"{s.device_used / mib:.0f}"
        lines.append(f"  {s.when:<24} {s.threads:>7} {s.rss / mib:>9.1f} {s.objects:>9} "
                     f"{device:>9} {s.layouts:>8}")
    return "\n".join(lines)
