"""The estimator on graphs small enough to work out by hand (float32[4] = 16 bytes each)."""

from graphmem.analysis.memory import estimate_memory
from tests.graphbuilder import G


def test_chain_holds_two_tensors_at_a_time():
    g = G()
    g.op("x", "Placeholder")
    g.op("a", "Relu", "x")
    g.op("b", "Relu", "a")
    g.op("c", "Relu", "b")
    est = estimate_memory(g.index())
    assert est.peak_bytes == 32


def test_diamond_holds_both_branches():
    g = G()
    g.op("x", "Placeholder")
    g.op("a", "Relu", "x")
    g.op("b", "Relu", "x")
    g.op("c", "Add", "a", "b")
    est = estimate_memory(g.index())
    # when b runs, its input x and the other branch a are still live: 48 (and again at c)
    assert est.peak_bytes == 48
    assert {t.name for t in est.live_at_peak} == {"x:0", "a:0", "b:0"}
    assert est.peak_op == "b"


def test_aliasing_op_allocates_nothing_and_extends_its_source():
    g = G()
    g.op("x", "Placeholder")
    g.op("r", "Reshape", "x")
    g.op("a", "Relu", "r")
    g.op("b", "Relu", "a")
    est = estimate_memory(g.index())
    # x lives until a runs (through its alias r): x + a = 32, then a + b = 32
    assert est.peak_bytes == 32
    g2 = G()
    g2.op("x", "Placeholder")
    g2.op("r", "Neg", "x")  # a real allocation instead of an alias
    g2.op("a", "Relu", "r")
    assert estimate_memory(g2.index()).peak_bytes == 32
    g3 = G()
    g3.op("x", "Placeholder")
    g3.op("r", "Reshape", "x")
    g3.op("a", "Relu", "r")
    g3.op("c", "Add", "a", "x")  # the alias's source is read late: x, a, c live together
    assert estimate_memory(g3.index()).peak_bytes == 48


def test_peaks_per_device_and_batch_size():
    g = G()
    g.op("x", "Placeholder", shape=(-1, 4), device="/device:GPU:0")
    g.op("a", "Relu", "x", shape=(-1, 4), device="/device:GPU:0")
    g.op("h", "Identity", "a", shape=(-1, 4), device="/device:CPU:0")
    g.op("c", "Relu", "h", shape=(-1, 4), device="/device:CPU:0")
    est = estimate_memory(g.index(), batch_size=10)  # 160 bytes a tensor
    assert est.peak_by_device["/device:GPU:0"] == 320
    assert est.peak_by_device["/device:CPU:0"] == 160
    assert est.peak_bytes == 320
    unknown = estimate_memory(g.index())
    assert unknown.peak_bytes == 0 and unknown.unknown_tensors == 3


def test_variables_are_persistent_not_step_memory():
    g = G()
    v = g.op("v", "VariableV2", shape=(4,), dtype=101)
    v.attr["dtype"].type = 1
    for d in (4,):
        v.attr["shape"].shape.dim.add(size=d)
    g.op("v/read", "Identity", "v")
    g.op("x", "Placeholder")
    g.op("y", "Mul", "x", "v/read")
    est = estimate_memory(g.index())
    assert est.persistent_bytes == 16
    assert est.peak_bytes == 32
