"""What a size sweep measures, shared by its pydfccl runs (``pydfccl.cli.sweep_measure``)
and its torch baseline (``pydfccl.torch.nccl_bench``): the options, the sizes in
nccl-tests' sense, the inputs every rank sends and the outputs expected of them."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..protocol.reference import buffer_elems, reference
from ..sched.policies import Policy

__all__ = ["SweepOptions", "bus_factor", "count_for", "sizes", "sweep_input",
           "expected_output", "SAME_FOR_EVERY_RANK"]


@dataclass(frozen=True)
class SweepOptions:
    coll: str = "all_reduce"
    nranks: int = 2
    minbytes: int = 8
    maxbytes: int = 1 << 20
    stepfactor: int = 2
    iters: int = 20
    warmup: int = 5
    check: bool = True
    dtype: str = "float32"
    op: str = "sum"
    root: int = 0
    policy: Policy | str = "dfccl"    # the daemon's: an object (with --param's) or a name
    progress: bool = True
    world: dict = field(default_factory=dict)   # WorldConfig sizes (nblocks, slot_bytes, ...)


def bus_factor(coll: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw for ``coll`` on ``nranks`` ranks."""
    if coll == "all_reduce":
        return 2 * (nranks - 1) / nranks
    if coll in ("all_gather", "reduce_scatter", "all_to_all"):
        return (nranks - 1) / nranks
    return 1.0


def count_for(coll: str, nbytes: int, itemsize: int, nranks: int) -> int:
    """Elements per rank (``prepare``'s count) for a size in nccl-tests' sense."""
    per_rank = nranks if coll in ("all_gather", "reduce_scatter", "all_to_all") else 1
    return max(1, nbytes // (itemsize * per_rank))


def sizes(opts: SweepOptions) -> list[tuple[int, int]]:
    """(size in bytes, count) for each step of the sweep; sizes that round to the same
    count are measured once."""
    itemsize = np.dtype(opts.dtype).itemsize
    out, nbytes = [], opts.minbytes
    while nbytes <= opts.maxbytes:
        count = count_for(opts.coll, nbytes, itemsize, opts.nranks)
        if not out or out[-1][1] != count:
            send, recv = buffer_elems(opts.coll, count, opts.nranks)
            out.append((max(send, recv) * itemsize, count))
        nbytes *= max(2, opts.stepfactor)
    return out


def sweep_input(rank: int, elems: int, dtype: str) -> np.ndarray:
    """Small integers: every op is exact in every dtype, at any rank count. Element i is
    (i + rank) % 3 + 1, a pattern repeated rather than computed: at 128 MiB a computed one
    took seconds a rank on the host, where the GPU's sweep waits."""
    pattern = ((np.arange(3 << 12) + rank) % 3 + 1).astype(dtype)   # a period: 3 elements
    return np.tile(pattern, -(-elems // pattern.size))[:elems]


# Kinds whose every rank gets the same output: one expected array serves all ranks.
SAME_FOR_EVERY_RANK = ("all_reduce", "all_gather", "broadcast")


@functools.lru_cache(maxsize=8)
def expected_output(coll: str, nranks: int, send_elems: int, dtype: str, op: str, root: int,
                    rank: int):
    """Rank ``rank``'s expected output. Cached: each cycle of ``-N`` and each rank of a kind
    in ``SAME_FOR_EVERY_RANK`` checks against the same array, computed once (numpy's
    reduction of 4 ranks x 128 MiB takes seconds)."""
    inputs = [sweep_input(r, send_elems, dtype) for r in range(nranks)]
    return reference(coll, inputs, op, root, rank)
