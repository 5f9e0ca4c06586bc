"""benchmarks/measure.py's placed feeds: where an array starts decides whether TF copies it
into its allocator (any start) or aliases it (64-byte aligned)."""

import numpy as np
import pytest

from benchmarks.measure import FEED_OFFSETS, placed


@pytest.mark.parametrize("alignment", sorted(FEED_OFFSETS))
@pytest.mark.parametrize("dtype, shape", [(np.float32, (4, 7, 3)), (np.int64, (5,)),
                                          (np.float16, (3, 3))])
def test_placed_arrays_start_where_asked_and_hold_the_same_values(alignment, dtype, shape):
    rng = np.random.default_rng(0)
    value = rng.standard_normal(shape).astype(dtype) if dtype != np.int64 else \
        rng.integers(0, 100, shape)
    for _ in range(8):  # whatever address the buffer gets
        out = placed(value, FEED_OFFSETS[alignment])
        assert out.ctypes.data % 64 == FEED_OFFSETS[alignment]
        assert out.dtype == value.dtype and out.shape == value.shape
        assert np.array_equal(out, value)
