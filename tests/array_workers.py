"""Rank workers for ``tests/ranks/test_arrays.py`` and ``tests/gpu/test_arrays_gpu.py``:
user programs written with the public API only (``comm.empty``, ``x[...] = v``,
``np.asarray``), which run unchanged on the simulator and on a GPU.
Module-level so that rank processes can import them; each returns plain data."""

import logging
import os
import tempfile

import numpy as np
from numba import cuda

import pydfccl


def array_idioms(comm, with_numpy: bool = True):
    """Fill with the documented idioms, run out of place, in place on a view, and (the
    simulator: ``with_numpy``) with numpy buffers; report the values and whether each
    result is the very object given."""
    n = comm.nranks
    comm.prepare(0, "all_reduce", count=8, dtype="int64")
    comm.prepare(1, "all_gather", count=2, dtype="float32")
    comm.prepare(2, "broadcast", count=4, dtype="bfloat16", root=1)
    comm.prepare(3, "reduce_scatter", count=2, dtype="int64")
    comm.start()
    x = comm.empty(8, "int64")
    x[...] = comm.rank
    x[:3] = np.arange(3) * (comm.rank + 1)
    y = comm.empty(8, "int64")
    out = comm.run(0, x, y).result(timeout=120)
    big = comm.empty(12, "int64")
    big[...] = -7
    big[2:10] = 1
    part = big[2:10]
    in_place = comm.run(0, part).result(timeout=120)
    g_send = comm.empty(2, "float32")
    g_send[...] = [comm.rank, 0.5]
    g_recv = comm.empty(2 * n, "float32")
    gathered = comm.run(1, g_send, g_recv).result(timeout=120)
    # NCCL's in-place forms: send is this rank's block of recv (all_gather), recv is this
    # rank's block of send (reduce_scatter)
    whole = comm.empty(2 * n, "float32")
    whole[...] = -1
    whole[2 * comm.rank:2 * comm.rank + 2] = [comm.rank, 0.5]
    comm.run(1, whole[2 * comm.rank:2 * comm.rank + 2], whole).result(timeout=120)
    scattered = comm.empty(2 * n, "int64")
    scattered[...] = np.arange(2 * n) + comm.rank
    comm.run(3, scattered, scattered[2 * comm.rank:2 * comm.rank + 2]).result(timeout=120)
    b = comm.empty(4, "bfloat16")
    b[...] = 1.5 if comm.rank == 1 else 0
    broadcast = comm.run(2, b).result(timeout=120)
    np_send, np_recv = np.full(8, comm.rank, np.int64), np.zeros(8, np.int64)
    np_out = comm.run(0, np_send, np_recv).result(timeout=120) if with_numpy else np_recv
    return dict(out=np.asarray(out).tolist(), same=out is y, type=type(out).__name__,
                in_place=np.asarray(big).tolist(), in_place_same=in_place is part,
                gathered=np.asarray(gathered).tolist(), gathered_same=gathered is g_recv,
                gathered_in_place=np.asarray(whole).tolist(),
                scattered_in_place=np.asarray(scattered).tolist(),
                broadcast=np.asarray(broadcast).astype(float).tolist(),
                np_same=np_out is np_recv, np_out=np_out.tolist())


def refused_buffers(comm):
    """Every buffer the checks refuse, with its message; then a read-only send buffer
    (only read) and a count=0 collective, which run."""
    comm.prepare(0, "all_reduce", count=8, dtype="float32")
    comm.prepare(1, "all_gather", count=4, dtype="float32")
    comm.prepare(2, "all_reduce", count=0, dtype="float32")
    comm.start()
    seen = []

    def refused(exc_type, *args, **kwargs):
        try:
            comm.run(*args, **kwargs)
        except exc_type as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        else:
            raise AssertionError(f"run{args} was not refused")

    x = comm.empty(8, "float32")
    x[...] = 1
    refused(ValueError, 0, comm.empty(9, "float32"))                # larger than prepared
    refused(ValueError, 0, comm.empty(7, "float32"))                # smaller
    frozen = np.ones(8, np.float32)
    frozen.setflags(write=False)
    refused(ValueError, 0, frozen)                                   # read-only, in place
    refused(ValueError, 0, x, np.frombuffer(bytes(32), np.float32))  # over bytes
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data")
        with open(path, "wb") as f:
            f.write(bytes(32))
        mapped = np.memmap(path, np.float32, mode="r", shape=(8,))
        refused(ValueError, 0, x, mapped)                            # read-only memory map
        del mapped
    both = comm.empty(12, "float32")
    refused(ValueError, 0, both[:8], both[4:])                       # overlapping
    gathered = comm.empty(6, "float32")
    refused(ValueError, 1, gathered[2:], gathered[:4])               # not NCCL's in place
    refused(TypeError, True, x)                                      # a bool for coll_id
    refused(TypeError, 0, x, priority=1.5)                           # a float for priority
    try:
        comm.prepare(3, "all_reduce", count=2**63)
    except ValueError as exc:
        seen.append(f"ValueError: {exc}")
    # a read-only send buffer is only read: accepted, and reduced
    send = np.full(8, comm.rank + 1, np.float32)
    send.setflags(write=False)
    out = comm.run(0, send, x).result(timeout=120)
    empty = comm.empty(0, "float32")
    zero = comm.run(2, empty)
    return dict(messages=seen, reduced=np.asarray(out).tolist(), zero_done=zero.done(),
                zero_same=zero.result(timeout=1) is empty)


class _Records(list):
    def emit(self, record):
        self.append(record)


def _warnings_of(comm, records):
    return [r.getMessage() for r in records if r.levelno >= logging.WARNING
            and r.getMessage().startswith(f"rank {comm.rank}:")]


def futures_hold_buffers(comm, drop_futures: bool):
    """Make buffers, submit, drop the buffers; keep the futures and wait for all at the end
    (the normal loop), or drop the futures too and wait for a later run of the same
    collective (runs of one collective complete in order)."""
    records = _Records()
    handler = logging.Handler()
    handler.emit = records.emit
    logging.getLogger("pydfccl").addHandler(handler)
    comm.prepare(0, "all_reduce", count=4, dtype="int64")
    comm.start()
    futures = []
    for step in range(3):
        x = comm.empty(4, "int64")
        x[...] = step + comm.rank
        future = comm.run(0, x)
        if not drop_futures:
            futures.append(future)
        del x, future
    last = comm.empty(4, "int64")
    last[...] = 1
    futures.append(comm.run(0, last))
    results = [np.asarray(f.result(timeout=120)).tolist() for f in futures]
    logging.getLogger("pydfccl").removeHandler(handler)
    return dict(results=results, dropped=comm.stats()["dropped_buffers"],
                warnings=_warnings_of(comm, records))



def bad_inputs(comm):
    """Every misuse must raise a clear error; returns the messages in order."""
    seen = []

    def expect(exc_type, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except exc_type as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
        else:
            raise AssertionError(f"{fn.__name__}{args} did not raise {exc_type.__name__}")

    x = comm.empty(10, "float32")
    expect(pydfccl.PydfcclError, comm.run, 0, x)                      # run before start
    expect(ValueError, comm.prepare, 0, "all_to_everyone", count=10)   # unknown kind
    expect(ValueError, comm.prepare, 0, "all_reduce", count=10, op="xor")
    expect(ValueError, comm.prepare, 0, "all_reduce", count=10, dtype="complex64")
    expect(ValueError, comm.prepare, 0, "all_reduce", count=-1)
    expect(TypeError, comm.prepare, 0, "all_reduce", count=10.0)
    expect(ValueError, comm.prepare, -1, "all_reduce", count=10)
    comm.prepare(0, "all_reduce", count=10, dtype="float32")
    expect(ValueError, comm.prepare, 0, "all_reduce", count=10)        # duplicate id
    comm.prepare(1, "reduce_scatter", count=5, dtype="float32")
    comm.start()
    expect(ValueError, comm.run, 1, x)                                 # no in-place form
    expect(ValueError, comm.run, 1, comm.empty(4, "float32"), x)       # send needs n * 5
    expect(ValueError, comm.prepare, 1, "all_reduce", count=10)        # taken, after start
    expect(pydfccl.PydfcclError, comm.start)                           # started already
    expect(ValueError, comm.run, 7, x)                                 # unknown coll_id
    expect(ValueError, comm.run, 0, comm.empty(9, "float32"))          # too small
    expect(TypeError, comm.run, 0, comm.empty(10, "int32"))            # wrong dtype
    expect(TypeError, comm.run, 0, [1.0] * 10)                         # not an array
    expect(ValueError, comm.run, 0, x, np.zeros(20, np.float32)[::2])  # not contiguous
    comm.run(0, x).result(timeout=60)                                  # still usable
    comm.close()
    expect(pydfccl.PydfcclError, comm.run, 0, x)                      # use after close
    return seen


# A producer that works ``work`` loops a thread before writing ``value + i`` (slow on a GPU,
# so that a run that did not wait for it would read the stale input), and a consumer that
# doubles. Module-level: the simulator runs a kernel with its module's ``cuda``.
@cuda.jit
def produce(a, value, work):
    i = cuda.grid(1)
    acc = 0.0
    for k in range(work):
        acc += 1e-30 * k
    if i < a.size:
        a[i] = value + i + acc * 0.0


@cuda.jit
def consume(a, out):
    i = cuda.grid(1)
    if i < a.size:
        out[i] = 2 * a[i]


def _produce_on(stream, a, value: float, work: int) -> None:
    """``produce`` on ``stream``; under the simulator, whose kernels cannot run while a
    daemon's does in the same process, the host writes the same values."""
    if hasattr(stream, "__cuda_stream__"):
        produce[1, a.size, stream](a, value, work)
    else:
        a[...] = value + np.arange(a.size)


def _consume_on(stream, a, out) -> None:
    if hasattr(stream, "__cuda_stream__"):
        consume[1, a.size, stream](a, out)
    else:
        out[...] = 2 * np.asarray(a)


def _stream_busy(stream) -> bool:
    """Whether ``stream`` still has work queued (always False under the simulator, whose
    kernels ran when they were launched)."""
    if not hasattr(stream, "__cuda_stream__"):
        return False
    from cuda.bindings import driver

    err, = driver.cuStreamQuery(driver.CUstream(stream.__cuda_stream__()[1]))
    return err == driver.CUresult.CUDA_ERROR_NOT_READY


def stream_ordered(comm, work: int):
    """``run(..., stream=)``: a producer kernel on the user's stream makes the input and the
    run starts after it without the host waiting; a consumer queued after ``result()``
    sees the sum. Then runs of one collective keep their order across ranks when rank 0's
    first one waits for a slow stream and the next one has none; a stream that is not
    one is refused by name, and the communicator goes on."""
    import time

    n, r, size = 256, comm.rank, comm.nranks
    comm.prepare(0, "all_reduce", count=n, dtype="float32")
    comm.prepare(1, "all_reduce", count=4, dtype="float32")
    comm.start()
    x = comm.empty(n, "float32")
    x[...] = -1.0                                  # stale: what a run too early would sum
    stream = cuda.stream()
    _produce_on(stream, x, r + 1.0, work)
    t0 = time.perf_counter()
    future = comm.run(0, x, stream=stream)
    returned_s = time.perf_counter() - t0
    busy_after_run = _stream_busy(stream)          # the host did not wait for the producer
    summed = future.result(timeout=120)
    summed_values = np.asarray(summed)             # x: in place, and used again below
    doubled = comm.empty(n, "float32")
    _consume_on(stream, summed, doubled)
    stream.synchronize()
    want = size * (size + 1) / 2 + size * np.arange(n)

    slow = cuda.stream()
    first, second = comm.empty(4, "float32"), comm.empty(4, "float32")
    first[...], second[...] = -1.0, 100.0 * (r + 1)
    _produce_on(slow, first, r + 1.0, work if r == 0 else 0)
    runs = [comm.run(1, first, stream=slow), comm.run(1, second)]
    ordered = [list(np.asarray(f.result(timeout=120))) for f in runs]
    try:
        comm.run(0, x, stream="default")
        refused = None
    except TypeError as exc:
        refused = str(exc)
    again = np.asarray(comm.run(0, x).result(timeout=120))
    return dict(summed_ok=bool(np.array_equal(summed_values, want)),
                same=summed is x, doubled_ok=bool(np.array_equal(np.asarray(doubled),
                                                                  2 * want)),
                busy_after_run=busy_after_run, returned_s=returned_s, ordered=ordered,
                refused=refused, again_ok=bool(np.array_equal(again, size * want)))
