"""Every rank of a world driven by one thread, as NCCL's ``ncclCommInitAll`` allows.

``pydfccl.launch`` gives each rank a Python thread; ranks that are threads of one process
share the GIL, and their hand-offs can cost more than a small collective. A program that
drives all ranks itself (a benchmark, a single-controller framework) makes them with
``init_all``, prepares each, calls ``start_all`` once (which compares every rank's
registrations, as ``start()`` does across rank threads), then submits and waits from one
thread::

    comms = pydfccl.init_all(2)
    for c in comms:
        c.prepare(0, "all_reduce", count=2)
    pydfccl.start_all(comms)
    futures = [c.run(0, x) for c, x in zip(comms, buffers)]
    results = [f.result() for f in futures]
    pydfccl.close_all(comms)

GPU only: under the simulator each rank is a process of its own.
"""

from __future__ import annotations

from .. import cuda_start
from ..errors import PydfcclError

__all__ = ["init_all", "start_all", "close_all"]


class _Registrations:
    """What start() compares across ranks: here every rank's registrations are at hand, and
    start_all hands them over before it starts each rank."""

    def __init__(self):
        self.all = None

    def __call__(self, mine):
        if self.all is None:
            raise PydfcclError("communicators from init_all() start together: call "
                               "pydfccl.start_all(comms), not comm.start()")
        return self.all


def init_all(nranks: int, *, policy="dfccl", watchdog_timeout: float | None = None,
             persistent: bool = True, timeout: float | None = None,
             **config) -> list[Communicator]:
    """Communicators for all ``nranks`` ranks of a new world on this GPU, for one thread to
    drive. ``config`` overrides WorldConfig sizes, as in ``launch``."""
    cuda_start.begin()         # beside the runtime's import, as launch() does
    from .. import platform
    from ..host.communicator import Communicator
    from ..host.world import World
    from ..host.world_config import WorldConfig

    if not platform.gpu_available():
        raise PydfcclError("init_all() needs a GPU: without one each rank is a simulated "
                           "process (use pydfccl.launch)")
    platform.backend.open_context()
    world = World(WorldConfig(nranks, **config))
    registrations = _Registrations()
    return [Communicator(world, rank, policy=policy, exchange=registrations,
                         watchdog_timeout=watchdog_timeout, persistent=persistent,
                         timeout=timeout)
            for rank in range(nranks)]


def start_all(comms: list[Communicator]) -> None:
    """End registration on every rank: compare the ranks' registrations (raising on the
    first difference, as start() does), then start each rank's daemon."""
    registrations = comms[0]._exchange
    if not isinstance(registrations, _Registrations) or any(
            c._exchange is not registrations for c in comms) or len(comms) != comms[0].nranks:
        raise PydfcclError("start_all() takes the whole list that one init_all() returned")
    registrations.all = [{cid: spec.signature() for cid, spec in c._specs.items()}
                         for c in comms]
    for comm in comms:
        comm.start()


def close_all(comms: list[Communicator]) -> None:
    for comm in comms:
        comm.close()
