"""The collectives a drawn schedule holds, shared by the model's and the engine's property
tests: an all-reduce of its drawn count, or an all_to_allv of its drawn counts."""

from pydfccl.sched.model import Collective


def drawn_collectives(counts, priorities, splits) -> dict:
    """Collective c: an all-reduce of ``counts[c]`` elements where ``splits[c]`` is None,
    else an all_to_allv of ``splits[c]`` (rank a sends rank b ``splits[c][a][b]``; at least
    one element moves, since an all_to_allv's count is its largest block)."""
    colls = {}
    for c, (count, priority, split) in enumerate(zip(counts, priorities, splits)):
        if split is None:
            colls[c] = Collective(count, priority)
        else:
            split[0][-1] = max(1, split[0][-1])
            colls[c] = Collective.all_to_allv(split, priority)
    return colls
