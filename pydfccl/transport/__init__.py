"""How a rank's daemon reaches a peer on another node: through a network proxy.

Within a node the daemons write each other's pools directly (shared memory under the
simulator, CUDA IPC on GPUs). For a peer on another node the daemon writes a *shadow* of
that peer's pool in its own process's host memory, exactly as it would the peer's pool, and
``proxy.NetProxy`` (a thread per world in each process) carries what it writes: a tail
that advanced with the slots it covers, a head that advanced, to the peer's proxy, which
writes them into the peer's own pool (data before counter). The daemon sees ordinary
connectors, so its waits on a remote peer are primitive waits like any other.

``rows.py`` keeps each node's replicas of the other nodes' control rows (what the
watchdog, liveness and late registrations read of a peer) and forwards aborts.
"""
