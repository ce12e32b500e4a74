"""Device memory writes on a GPU (platform/gpu.py): a shared slot's reset zeroes strided
regions and copies a table entry in one call; the bytes read back are exactly those."""

import numpy as np
import pytest

from pydfccl import platform

pytestmark = pytest.mark.skipif(not platform.gpu_available(), reason="needs a GPU")


def test_zero_rows_zeroes_the_strided_regions_then_writes():
    from pydfccl.platform.gpu import GpuDeviceBuffer

    buf = GpuDeviceBuffer(1 << 16)
    buf.write(0, np.full(1 << 16, 0xAB, np.uint8))
    entry = np.arange(40, dtype=np.uint8)
    buf.zero_rows([(256, 1024, 96, 32), (40_000, 64, 64, 1)], write=(50_000, entry))
    got = buf.read(0, 1 << 16)
    want = np.full(1 << 16, 0xAB, np.uint8)
    for row in range(32):
        want[256 + row * 1024: 256 + row * 1024 + 96] = 0
    want[40_000:40_064] = 0
    want[50_000:50_040] = entry
    assert np.array_equal(got, want)
