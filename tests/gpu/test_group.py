"""One thread driving every rank (init_all / start_all): the single-controller path."""

import numpy as np
import pytest

import pydfccl
from pydfccl import platform

gpu_only = pytest.mark.skipif(not platform.gpu_available(), reason="init_all needs a GPU")


def test_init_all_needs_a_gpu_under_the_simulator():
    if platform.gpu_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(pydfccl.PydfcclError, match="needs a GPU"):
        pydfccl.init_all(2)


@gpu_only
def test_one_thread_runs_every_rank():
    comms = pydfccl.init_all(3)
    try:
        for c in comms:
            c.prepare(0, "all_reduce", count=1000, dtype="int64")
            c.prepare(1, "all_gather", count=5, dtype="float32")
        pydfccl.start_all(comms)
        xs = [c.empty(1000, "int64") for c in comms]
        for r, x in enumerate(xs):
            x[...] = np.arange(1000, dtype=np.int64) * (r + 1)
        g_in = [c.empty(5, "float32") for c in comms]
        g_out = [c.empty(15, "float32") for c in comms]
        for r, g in enumerate(g_in):
            g[...] = r
        for _ in range(20):   # disordered: rank 1 submits the gather first
            futures = [c.run(1, a, b) for c, a, b in zip(comms, g_in, g_out) if c.rank == 1]
            futures += [c.run(0, x) for c, x in zip(comms, xs)]
            futures += [c.run(1, a, b) for c, a, b in zip(comms, g_in, g_out) if c.rank != 1]
            for f in futures:
                f.result(timeout=60)
        # In place: the first run leaves (1+2+3) * arange on every rank, each later run
        # triples it.
        want_sum = np.arange(1000, dtype=np.int64) * 6 * 3 ** 19
        for x in xs:
            assert np.array_equal(np.asarray(x), want_sum)
        for g in g_out:
            assert np.array_equal(np.asarray(g), np.repeat(np.arange(3, dtype=np.float32), 5))
    finally:
        pydfccl.close_all(comms)


@gpu_only
def test_start_all_compares_registrations_and_start_alone_is_refused():
    comms = pydfccl.init_all(2)
    try:
        comms[0].prepare(0, "all_reduce", count=4)
        comms[1].prepare(0, "all_reduce", count=5)
        with pytest.raises(pydfccl.PydfcclError, match="start_all"):
            comms[0].start()
        with pytest.raises(ValueError, match="field 'count' differs"):
            pydfccl.start_all(comms)
    finally:
        pydfccl.close_all(comms)
