"""benchmarks/thread_overlap.py's arithmetic: the step's time by kernels running at once,
and each kernel's time alone, from kernel start and end times."""

from __future__ import annotations

import pytest

from benchmarks.thread_overlap import overlap

S = 10**12  # picoseconds per second


def test_time_is_split_by_kernels_running_at_once():
    # a: 0-4 s alone until b starts at 1 s; b: 1-2 s; gap 4-5 s; c: 5-6 s alone
    kernels = [(0, 4 * S, "a:Conv2D"), (1 * S, 2 * S, "b:Conv2DBackpropFilter"),
               (5 * S, 6 * S, "c:Conv2D")]
    o = overlap(kernels, 6.0, top=10)
    assert o.by_running == pytest.approx({0: 1.0, 1: 4.0, 2: 1.0})
    assert dict(o.alone) == pytest.approx({"a:Conv2D": 3.0, "c:Conv2D": 1.0})
    assert dict(o.by_type) == pytest.approx({"Conv2D": 5.0, "Conv2DBackpropFilter": 1.0})


def test_kernels_ending_as_others_start_never_overlap():
    kernels = [(0, S, "a:MatMul"), (S, 2 * S, "b:MatMul")]
    o = overlap(kernels, 2.0, top=1)
    assert o.by_running == pytest.approx({1: 2.0})
    assert o.by_type == [("MatMul", pytest.approx(2.0))]
    assert len(o.alone) == 1  # `top` keeps the longest
