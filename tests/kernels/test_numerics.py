"""float16 and bfloat16: dtype names, buffers, the reference's ring order, and the daemon's
16-bit conversions.

The conversions are device functions; under the simulator they run as Python, so a
subprocess with the simulator checks them against ml_dtypes: every bfloat16 bit pattern
widened, and rounding to bfloat16 at every tie, either side of every tie and at random
float32 patterns. It also replays the engine's own step plans (``plan_step``) to find which
rank starts each element's reduction, and checks ``reference.ring_order`` against it. (The
PTX of the same functions is checked by test_kernels_compile.py; they run on the GPU only
there.)
"""

import ml_dtypes
import numpy as np
import pytest

from pydfccl.host.buffers import check_buffer, dtype_accepted
from pydfccl.protocol.codes import BFLOAT16, DTYPES, dtype_code, normalize_dtype, storage_dtype
from pydfccl.host.communicator import CollSpec
from pydfccl.protocol.reference import reference, ring_order

SCRIPT = r"""
import json
import numpy as np, ml_dtypes
from pydfccl.kernels import numerics as nm
from pydfccl.kernels.memory import SIMULATOR
from pydfccl.kernels.plans import ONE_SHOT, plan_step
from pydfccl.protocol.one_shot import table_kind
from pydfccl.kernels.primitives import F_ALL, F_RECV, F_SEND, F_USER_IN
from pydfccl.kernels.ring import channel_count, channel_span
from pydfccl.protocol.reference import ring_order

assert SIMULATOR
widen, narrow = nm.bfloat16_to_float32.py_func, nm.float32_to_bfloat16.py_func
report = {}
bits = np.arange(1 << 16, dtype=np.uint32)
wide = np.array([widen(np.uint16(b)) for b in bits], np.float32)
report["widen_exact"] = bool(np.array_equal(wide.view(np.uint32), bits << 16))

rng = np.random.default_rng(0)
patterns = np.concatenate([bits << 16,                 # every bfloat16 value
                           (bits << 16) | 0x8000,      # every tie: to even
                           (bits << 16) | 0x7FFF,      # just below a tie
                           (bits << 16) | 0x8001,      # just above
                           rng.integers(0, 1 << 32, 20000, dtype=np.uint32)]).astype(np.uint32)
floats = patterns.view(np.float32)
got = np.array([narrow(x) for x in floats], np.uint16)
want = floats.astype(ml_dtypes.bfloat16).view(np.uint16)
nan = np.isnan(floats)
report["narrow_matches_ml_dtypes"] = bool(np.array_equal(got[~nan], want[~nan]))
report["nan_stays_nan"] = bool(np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all())
report["nan_count"] = int(nan.sum())

h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
h = h[~np.isnan(h)]
report["half_round_trip"] = bool(np.array_equal(
    np.array([nm.float32_to_float16.py_func(nm.float16_to_float32.py_func(x)) for x in h],
             np.float16).view(np.uint16), h.view(np.uint16)))

# Who starts each element's reduction, read off the engine's own plans: the rank whose step
# sends its own input without receiving (SEND_ONLY) for that element.
KIND = {"all_reduce": 0, "reduce_scatter": 2, "reduce": 4}
SMALL = (1, 5, 64, 100, 257, 700)
# (nblocks, slot_bytes, itemsize, counts); the last has slots above ring.MIN_CHANNEL_CHUNK,
# whose channels hold less than a loop
SIZES = ((1, 256, 2, SMALL), (3, 64, 2, SMALL), (2, 128, 4, SMALL),
         (4, 131072, 4, (700, 40000, 100001, 300000)))
mismatches = []
for kind in KIND:
    for nranks in (2, 3, 4):
        for nblocks, slot_bytes, itemsize, counts in SIZES:
            for count in counts:
                slot = slot_bytes // itemsize
                loop = slot * (nranks if kind == "all_reduce" else 1)
                nch = channel_count(kind == "all_reduce", count, itemsize, nranks, nblocks,
                                    slot_bytes)
                elems = count * (nranks if kind == "reduce_scatter" else 1)
                root = nranks - 1
                first = np.full(elems, -1)
                steps = {"all_reduce": 2 * nranks - 1, "reduce_scatter": nranks, "reduce": 1}
                code = table_kind(kind, count, itemsize, nranks, slot_bytes)
                for block in range(nch):
                    begin, end = channel_span(count, nch, block)
                    for rank in range(nranks):
                        for lp in range(-(-(end - begin) // loop)):
                            for step in range(2 if code == ONE_SHOT else steps[kind]):
                                flags, start, _, n = plan_step(code, rank, nranks, root,
                                                               count, begin, end, lp, step, slot)
                                if flags & F_ALL:      # one-shot: all ranks in rank order
                                    if flags & F_RECV:
                                        first[start:start + n] = 0
                                elif flags & (F_USER_IN | F_SEND | F_RECV) == F_USER_IN | F_SEND:
                                    first[start:start + n] = rank
                want = ring_order(kind, elems, nranks, root, itemsize=itemsize,
                                  nblocks=nblocks, slot_bytes=slot_bytes)
                if not np.array_equal(first, want):
                    mismatches.append([kind, nranks, count, nblocks, slot_bytes, itemsize])
report["ring_order_mismatches"] = mismatches
print(json.dumps(report))
"""


def test_conversions_and_ring_order_in_the_simulator(simulated_report):
    report = simulated_report(SCRIPT)
    assert report["widen_exact"]
    assert report["narrow_matches_ml_dtypes"]
    assert report["nan_count"] > 0 and report["nan_stays_nan"]
    assert report["half_round_trip"]
    assert report["ring_order_mismatches"] == []


def test_16bit_dtype_names():
    assert normalize_dtype("bfloat16") == BFLOAT16 == normalize_dtype(ml_dtypes.bfloat16)
    assert normalize_dtype(np.float16) == np.dtype("float16")
    assert dtype_code("float16") == DTYPES["float16"] != dtype_code("bfloat16")
    assert storage_dtype("bfloat16") == np.uint16
    assert storage_dtype("float16") == np.float16
    with pytest.raises(ValueError, match="unknown dtype 'uint16'"):
        normalize_dtype(np.uint16)


class _DeviceArray:
    """What check_buffer reads of a GPU array: its __cuda_array_interface__."""

    def __init__(self, typestr, n):
        self.__cuda_array_interface__ = dict(shape=(n,), typestr=typestr, data=(4096, False),
                                             strides=None, version=3)


def test_bfloat16_buffers_are_bfloat16_or_raw_bits(monkeypatch):
    from pydfccl.platform import backend

    # GPU buffers are checked as the GPU backend checks them (this process runs the simulator)
    monkeypatch.setattr(type(backend), "device_memory_is_host", False)
    spec = CollSpec(3, "all_reduce", 8, "bfloat16", "sum", 0, 0)
    assert dtype_accepted(BFLOAT16, "bfloat16") and dtype_accepted(np.dtype(np.uint16), "bfloat16")
    assert not dtype_accepted(np.dtype(np.uint16), "float16")
    assert check_buffer(_DeviceArray("<u2", 8), spec, "send", 8) == 4096
    for wrong in ("<f2", "<i2", "<V2", "<f4"):
        with pytest.raises(TypeError, match=r"expected bfloat16 or uint16 \(its raw bits"):
            check_buffer(_DeviceArray(wrong, 8), spec, "send", 8)
    half = CollSpec(4, "all_reduce", 8, "float16", "sum", 0, 0)
    assert check_buffer(_DeviceArray("<f2", 8), half, "recv", 8) == 4096
    with pytest.raises(TypeError, match="has dtype uint16, expected float16$"):
        check_buffer(_DeviceArray("<u2", 8), half, "recv", 8)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reference_rounds_at_every_ring_step(dtype):
    """Three ranks' values whose sum depends on the order: 1 + 2**-11 + 2**-11 in float16
    (2**-8 in bfloat16) is 1 when the ones come first, and a step above 1 when the two
    small ones are added first. Rank 1 starts a reduce rooted at rank 0 (the ring order is
    1, 2, 0)."""
    tiny = 2.0 ** (-11 if dtype == "float16" else -8)
    inputs = [np.array([x], dtype) for x in (1.0, tiny, tiny)]
    assert reference("reduce", inputs, "sum", root=0, rank=0)[0] == np.array(1 + 2 * tiny, dtype)
    assert reference("reduce", inputs, "sum", root=2, rank=2)[0] == 1.0   # order 0, 1, 2
    assert reference("reduce", inputs, "avg", root=2, rank=2)[0] == np.array(1 / 3, dtype)
    assert list(ring_order("reduce_scatter", 6, 3)) == [1, 1, 2, 2, 0, 0]
