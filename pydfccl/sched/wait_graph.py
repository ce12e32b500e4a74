"""Cycles in a wait-for graph: what the model reports for a deadlock and the host watchdog
for a stuck world."""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Union

__all__ = ["find_wait_cycle"]


def find_wait_cycle(edges: Mapping[int, Union[int, Sequence[int]]]) -> Optional[List[int]]:
    """A cycle of the wait-for graph, or None.

    ``edges`` maps a node to the node (or nodes) it waits on. The cycle comes back as
    ``[a, b, ..., z]``: a waits on b, ..., z waits on a, starting at its smallest node, the
    same answer for the same graph (the host watchdog reports it as is).
    """
    succ = {n: (list(v) if hasattr(v, "__iter__") else [v]) for n, v in edges.items()}
    state: Dict[int, int] = {}  # 1: on the current path, 2: explored
    for root in sorted(succ):
        if root in state:
            continue
        path, where = [root], {root: 0}
        stack = [iter(succ[root])]
        state[root] = 1
        while stack:
            for nxt in stack[-1]:
                seen = state.get(nxt)
                if seen == 1:
                    cycle = path[where[nxt]:]
                    low = cycle.index(min(cycle))
                    return cycle[low:] + cycle[:low]
                if seen is None:
                    state[nxt] = 1
                    where[nxt] = len(path)
                    path.append(nxt)
                    stack.append(iter(succ.get(nxt, ())))
                    break
            else:
                stack.pop()
                done = path.pop()
                del where[done]
                state[done] = 2
    return None
