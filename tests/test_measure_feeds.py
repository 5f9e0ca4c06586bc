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


def test_every_step_has_its_wall_time_and_peak():
    """`step_seconds` and `steps` hold one entry per step run, warm-up steps included, in
    order: where a run's step time settles is read from them."""
    from benchmarks.measure import measure_here
    from tests.conftest import fixture_path

    out = measure_here(str(fixture_path("mlp")), 8, 1, steps=3, warmup=2)
    assert len(out["step_seconds"]) == len(out["steps"]) == 5
    assert all(s > 0 for s in out["step_seconds"])
    assert len(out["losses"]) == 3  # the measured steps' alone
    measured = sorted(out["step_seconds"][2:])
    assert measured[0] <= out["seconds"] <= measured[-1]
