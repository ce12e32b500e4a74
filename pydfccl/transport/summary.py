"""Which transport each pair of ranks used, as the demo and the benchmark print it."""

from __future__ import annotations

__all__ = ["describe_transports", "net_stats", "transports_line"]


def describe_transports(counts: dict) -> str:
    """``pairs: 2 ipc, 4 mpi`` from ``World.transports()`` (a transport no pair uses is
    left out)."""
    used = [f"{pairs} {name}" for name, pairs in counts.items() if pairs]
    return "pairs: " + (", ".join(used) or "none")


def net_stats(comm) -> dict | None:
    """The messages rank ``comm``'s network proxy sent and received, by kind (None
    without a proxy: every peer on its node)."""
    net = comm.world.net
    return None if net is None else dict(net.stats)


def transports_line(per_rank: list[dict]) -> str:
    """The pairs by transport and, where a proxy ran, the slots and heads the proxies sent
    (every rank's ``transports`` and ``net``, as the demo's workers return them): the end
    of the demo's summary line."""
    line = describe_transports(per_rank[0]["transports"])
    nets = [r["net"] for r in per_rank if r.get("net")]
    if nets:
        slots = sum(n["sent_slot"] for n in nets)
        heads = sum(n["sent_head"] for n in nets)
        line += f" (the network proxies sent {slots} slots and {heads} heads)"
    return line
