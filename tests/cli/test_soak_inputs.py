"""The soak's check makes every rank's inputs of a run in one expression; they are exactly
the inputs each rank filled its send buffer with, in every dtype and op the soak draws."""

import numpy as np
import pytest

from pydfccl.cli.soak_schedules import soak_input, soak_inputs
from pydfccl.protocol.codes import normalize_dtype


@pytest.mark.parametrize("dtype", ["int8", "int32", "float16", "bfloat16", "float32"])
@pytest.mark.parametrize("op", ["sum", "prod", "max"])
def test_every_ranks_inputs_at_once_equal_each_ranks_own(dtype, op):
    dtype = normalize_dtype(dtype).name
    for nranks in (1, 2, 5, 8):
        rows = soak_inputs(coll=3, run=2, count=41, dtype=dtype, op=op, nranks=nranks)
        assert rows.shape == (nranks, 41) and rows.dtype == np.dtype(dtype)
        for rank in range(nranks):
            want = soak_input(rank, 3, 2, 41, dtype, op, nranks)
            assert np.array_equal(rows[rank].view(np.uint8), want.view(np.uint8))
