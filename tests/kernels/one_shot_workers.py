"""What each rank runs in ``test_one_shot.py`` beyond ``shared_workers``: a module because
``pydfccl.launch`` spawns rank processes that import the function by name (the test's folder
is on their path)."""

__all__ = ["one_shot_limits_differ"]


def one_shot_limits_differ(comm, late: bool):
    """Rank 1 runs the small all_reduce in the ring (as its PYDFCCL_ONE_SHOT_BYTES=0 would
    decide), the others one-shot: preparing at start, or after it (``late``), must fail,
    not hang. The decision is patched on rank 1's communicator alone, not in ``plans``,
    which rank threads of one process share."""
    from pydfccl.protocol.codes import KINDS

    if comm.rank == 1:
        comm._catalog.daemon_kind = lambda spec: KINDS[spec.kind]
    if late:
        comm.start()
    comm.prepare(0, "all_reduce", count=4, dtype="float32")
    if not late:
        comm.start()
    return comm.run(0, comm.empty(4, "float32")).result(timeout=60)
