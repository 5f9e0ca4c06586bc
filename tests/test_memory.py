"""The estimator on graphs small enough to work out by hand.

Tensors are float32[2048] (U = 8 KiB: large enough that the executor treats their ops as
expensive). `Op` stands for any kernel that allocates its output; Relu shows buffer reuse,
Reshape and Identity show aliasing.
"""

from graphmem.analysis.memory import estimate_memory
from graphmem.analysis.schedule import executor_order
from tests.graphbuilder import G

U = 8192
N = (2048,)


def test_chain_holds_two_tensors_at_a_time():
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("b", "Op", "a", shape=N)
    g.op("c", "Op", "b", shape=N)
    assert estimate_memory(g.index()).peak_bytes == 2 * U


def test_diamond_runs_the_last_readied_branch_first():
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("b", "Op", "x", shape=N)
    g.op("c", "Op", "a", "b", shape=N)
    ix = g.index()
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "b", "a", "c"]
    est = estimate_memory(ix)
    # when a runs, x (read by a), b and a are live: 3U (and again at c: a, b, c)
    assert est.peak_bytes == 3 * U
    assert {t.name for t in est.live_at_peak} == {"x:0", "a:0", "b:0"}
    assert est.peak_op == "a"


def test_aliasing_op_allocates_nothing_and_extends_its_source():
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("r", "Reshape", "x", shape=N)
    g.op("a", "Op", "r", shape=N)
    g.op("b", "Op", "a", shape=N)
    assert estimate_memory(g.index()).peak_bytes == 2 * U  # x+a, then a+b
    g2 = G()
    g2.op("x", "Placeholder", shape=N)
    g2.op("r", "Reshape", "x", shape=N)
    g2.op("a", "Op", "r", shape=N)
    g2.op("c", "Op", "a", "x", shape=N)  # x is read late through its alias: x, a, c
    assert estimate_memory(g2.index()).peak_bytes == 3 * U


def test_elementwise_ops_reuse_a_buffer_read_for_the_last_time():
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("r", "Relu", "a", shape=N)  # a is read only here: r takes over its buffer
    g.op("s", "Relu", "r", shape=N)
    assert estimate_memory(g.index()).peak_bytes == 2 * U  # x + a, then one buffer
    g2 = G()
    g2.op("x", "Placeholder", shape=N)
    g2.op("a", "Op", "x", shape=N)
    g2.op("r", "Relu", "a", shape=N)
    g2.op("c", "Op", "a", "r", shape=N)  # a is read again after r: r allocates
    assert estimate_memory(g2.index()).peak_bytes == 3 * U


def test_executor_order_is_depth_first():
    # two branches with a big first op (2U) and a small second one (U), joined at the end
    g = G()
    g.op("x", "Placeholder", shape=N)
    for b in "ab":
        g.op(f"{b}0", "Op", "x", shape=(4096,))
        g.op(f"{b}1", "Op", f"{b}0", shape=N)
    g.op("join", "Op", "a1", "b1", shape=N)
    ix = g.index()
    # depth first: b0, b1, then a0 (x, b1, a0 = 4U) and a1 (b1, a0, a1 = 4U)
    assert estimate_memory(ix).peak_bytes == 4 * U
    # breadth first holds both big ops at once: x, a0, b0 = 5U
    assert estimate_memory(ix, schedule="topo").peak_bytes == 5 * U


def test_small_ops_run_inline_in_order():
    g = G()
    g.op("x", "Placeholder", shape=(4,))
    g.op("a", "Op", "x", shape=(4,))
    g.op("b", "Op", "x", shape=(4,))
    ix = g.index()
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "a", "b"]


def test_peaks_per_device_and_batch_size():
    g = G()
    g.op("x", "Placeholder", shape=(-1, 2048), device="/device:GPU:0")
    g.op("a", "Op", "x", shape=(-1, 2048), device="/device:GPU:0")
    g.op("h", "Identity", "a", shape=(-1, 2048), device="/device:CPU:0")
    g.op("c", "Op", "h", shape=(-1, 2048), device="/device:CPU:0")
    v = 10 * 2048 * 4
    est = estimate_memory(g.index(), batch_size=10)
    # x, a on the GPU; h is an Identity across devices, so a copy: h then c on the CPU
    assert est.peak_by_device["/device:GPU:0"] == 2 * v
    assert est.peak_by_device["/device:CPU:0"] == 2 * v
    assert est.peak_bytes == 2 * v
    host = estimate_memory(g.index(), batch_size=10, host_device="/cpu:0")
    assert host.peak_bytes == 2 * v and host.host_peak_bytes == 2 * v
    unknown = estimate_memory(g.index())
    assert unknown.peak_bytes == 0 and unknown.unknown_tensors == 4


def test_swapped_tensor_leaves_the_device_between_its_uses():
    # a (U) is made early and read late; b and c (2U each) come in between
    def graph(swap: bool):
        g = G()
        g.op("x", "Placeholder", shape=N)
        g.op("a", "Op", "x", shape=N)
        g.op("b", "Op", "a", shape=(4096,))
        g.op("c", "Op", "b", shape=(4096,))
        late_input = "a"
        if swap:
            g.op("a_out", "Identity", "a", shape=N, device="/device:CPU:0")
            g.op("a_in", "Identity", "a_out", "^c", shape=N)
            late_input = "a_in"
        g.op("d", "Op", "c", late_input, shape=N)
        return g.index()

    plain = estimate_memory(graph(False), host_device="/device:CPU:0")
    swapped = estimate_memory(graph(True), host_device="/device:CPU:0")
    # plain: at c, a + b + c = 5U. swapped: a leaves after b (a + b = 3U), c: b + c = 4U,
    # then a_in comes back after c: c + a_in + d = 4U at d
    assert plain.peak_bytes == 5 * U
    assert swapped.peak_bytes == 4 * U
    assert swapped.host_peak_bytes == U


def test_variables_are_persistent_not_step_memory():
    g = G()
    v = g.op("v", "VariableV2", shape=(4,), dtype=101)
    v.attr["dtype"].type = 1
    v.attr["shape"].shape.dim.add(size=4)
    g.op("v/read", "Identity", "v", shape=(4,))
    g.op("x", "Placeholder", shape=N)
    g.op("y", "Op", "x", "v/read", shape=N)
    est = estimate_memory(g.index())
    assert est.persistent_bytes == 16
    assert est.peak_bytes == 2 * U
