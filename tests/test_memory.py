"""The estimator on graphs small enough to work out by hand.

Tensors are float32[2048] (U = 8 KiB: large enough that the executor treats their ops as
expensive). `Op` stands for any kernel that allocates its output; Relu shows buffer reuse,
Reshape and Identity show aliasing. The sums are of the bytes asked for: what TF's allocator
hands out for them (chunks up to twice a request) is tested in tests/test_bfc.py.
"""

from functools import partial

from graphmem.analysis.memory import estimate_memory as _estimate_memory
from graphmem.analysis.schedule import executor_order
from tests.graphbuilder import G

U = 8192
N = (2048,)
estimate_memory = partial(_estimate_memory, allocator=False)


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


def test_tf_warm_up_order_is_simulated_too_and_the_higher_peak_kept():
    # a's last reader s is small. In TF's steady state it runs inline right after a and
    # frees a before b runs; in TF's first ~90 steps every kernel is expensive, so s is
    # dispatched as a task and b (readied with it) runs first, while a is still live
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("s", "Op", "a", shape=(4,))
    g.op("b", "Op", "x", "^a", shape=N)
    ix = g.index()
    steady = executor_order(ix)
    warm = executor_order(ix, warm_up=True)
    assert [ix.names[i] for i in steady] == ["x", "a", "s", "b"]
    assert [ix.names[i] for i in warm] == ["x", "a", "b", "s"]
    # x, a and s (256 bytes: buffers are counted as the allocator rounds them)
    assert estimate_memory(ix, order=steady).peak_bytes == 2 * U + 256
    est = estimate_memory(ix)
    assert est.peak_bytes == 3 * U  # x, a, b
    assert (est.phase, est.peak_op) == ("warm-up", "b")
    # where both orders agree, the estimate is the steady state's
    assert estimate_memory(ix, order=warm).phase == "steady"


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


def _update_graph():
    """A variable v (U), read by r; a = Op(x, r); the update writes v from a; c reads r."""
    g = G()
    g.op("v", "VarHandleOp", shape=(), dtype=20)
    g.op("r", "ReadVariableOp", "v", shape=N)
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", "r", shape=N)
    g.op("upd", "AssignSubVariableOp", "v", "a", n_out=0)
    g.op("c", "Op", "r", "a", shape=N)
    return g.index()


def test_update_copies_a_variable_a_pending_read_still_holds():
    ix = _update_graph()
    names = ["v", "r", "x", "a", "upd", "c"]
    early = estimate_memory(ix, order=[ix.id_of[n] for n in names])
    # x: U; a: x + a = 2U; upd: r is still to be read by c, so v gets a new buffer and the
    # old one stays with r: a + old = 2U; c: a + old + c = 3U
    assert early.peak_bytes == 3 * U
    assert early.peak_op == "c"
    assert any("kept by a read while upd" in t.name for t in early.live_at_peak)
    late = ["v", "r", "x", "a", "c", "upd"]
    # c ran first: r has no reader left when upd writes, so v is written in place; a + c
    assert estimate_memory(ix, order=[ix.id_of[n] for n in late]).peak_bytes == 2 * U


def test_update_after_a_copy_writes_the_new_buffer_in_place():
    g = G()
    g.op("v", "VarHandleOp", shape=(), dtype=20)
    g.op("r", "ReadVariableOp", "v", shape=N)
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", "r", shape=N)
    g.op("u1", "AssignSubVariableOp", "v", "a", n_out=0)
    g.op("u2", "AssignSubVariableOp", "v", "a", n_out=0)
    g.op("c", "Op", "r", "a", shape=N)
    ix = g.index()
    est = estimate_memory(ix, order=[ix.id_of[n] for n in ["v", "r", "x", "a", "u1", "u2",
                                                            "c"]])
    # u1 copies (r still pending), u2 writes u1's new buffer, which no read shares: at c,
    # a + the old buffer + c = 3U, not 4U
    assert est.peak_bytes == 3 * U


def test_function_body_sources_start_together():
    # a TF2 step body: x arrives as an _Arg; a const k feeds m (U), read at the end by j.
    # The chain a1..a3 makes 2U tensors.
    g = G()
    g.op("x", "_Arg", shape=N)
    g.op("a1", "Op", "x", shape=(4096,))
    g.op("a2", "Op", "a1", shape=(4096,))
    g.op("a3", "Op", "a2", shape=(4096,))
    g.op("k", "Const", shape=N)
    g.op("m", "Op", "k", shape=N)
    g.op("j", "Op", "a3", "m", shape=N)
    ix = g.index()
    # x and k are ready together (the inlined call's input control node readies both):
    # x, k run inline; a1 (readied while k waits) is dispatched, m (readied last) runs next
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "k", "m", "a1", "a2", "a3",
                                                         "j"]
    # at a2: m + a1 + a2 = 5U
    assert estimate_memory(ix).peak_bytes == 5 * U
    # the same graph with a Placeholder for x (a TF1 graph): each root's chain runs to
    # its end before the next root; the constant k first (TF ran a TF1 step's root
    # constants before its feeds and variables, traced on tf-slim's AlexNet): k, m, then
    # x's chain, with m live throughout (at a2 m + a1 + a2 = 5U)
    g.graph_def.node[0].op = "Placeholder"
    tf1 = g.index()
    assert [tf1.names[i] for i in executor_order(tf1)] == ["k", "m", "x", "a1", "a2", "a3",
                                                           "j"]
    assert estimate_memory(tf1).peak_bytes == 5 * U
    # without the constant first (k a Placeholder too), the roots run in graph order
    g.graph_def.node[4].op = "Placeholder"
    roots = g.index()
    assert [roots.names[i] for i in executor_order(roots)] == ["x", "a1", "a2", "a3", "k",
                                                               "m", "j"]


def test_small_buffers_take_what_the_allocator_hands_out():
    # TF's BFC allocator rounds every buffer up to a multiple of 256 bytes: three 16-byte
    # tensors in a chain hold 2 x 256 bytes at a time, and a 300-byte one 512
    g = G()
    g.op("x", "Placeholder", shape=(4,))
    g.op("a", "Op", "x", shape=(4,))
    g.op("b", "Op", "a", shape=(4,))
    assert estimate_memory(g.index()).peak_bytes == 2 * 256
    g.op("c", "Op", "b", shape=(75,))
    assert estimate_memory(g.index()).peak_bytes == 256 + 512


def test_ops_only_a_group_waits_for_are_not_computed():
    # tf.gradients builds the gradient for an input that needs none (d, 2U, reading a) and
    # groups it with the useful one (b) through a NoOp; nothing reads d. Grappler turns
    # such ops into NoOps, so d neither runs nor holds a.
    from graphmem.analysis.pruning import unread_ops

    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("b", "Op", "a", shape=N)
    g.op("d", "Op", "a", shape=(4096,))
    g.op("grp", "NoOp", "^b", "^d", n_out=0)
    g.op("out", "Identity", "b", "^grp", shape=N)
    g.op("w", "VarHandleOp", shape=(), dtype=20)
    g.op("upd", "AssignSubVariableOp", "w", "out", n_out=0)
    ix = g.index()
    step = set(range(len(ix)))
    assert {ix.names[i] for i in unread_ops(ix, step, [])} == {"d"}
    # as written: x, a (2U), then a's readers: d kept inline (a + d = 3U), b (a + b)
    assert estimate_memory(ix, nodes=step).peak_bytes == 3 * U
    assert estimate_memory(ix, nodes=step - unread_ops(ix, step, [])).peak_bytes == 2 * U
    # a fetched op is computed even when nothing reads it
    assert unread_ops(ix, step, [ix.id_of["d"]]) == set()


def test_grouping_ops_grappler_removes_do_not_hold_back_an_expensive_op():
    # tf.gradients follows a gradient `a` with tuple/group_deps (NoOp) and
    # tuple/control_dependency (Identity with a control input). Grappler removes both, so
    # `a` readies `d` (through them) together with `c`; of the expensive ops one op
    # readies, TF runs the one later in the GraphDef (its last out-edge) next
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("grp", "NoOp", "^a", n_out=0)
    g.op("ctl", "Identity", "a", "^grp", shape=N)
    g.op("d", "Op", "ctl", shape=N)
    g.op("c", "Op", "a", shape=N)  # later in the GraphDef: runs first
    ix = g.index()
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "a", "grp", "ctl", "c", "d"]
    # written the other way round, d runs first: the removed ops take no turn
    g2 = G()
    for node in [g.graph_def.node[k] for k in (0, 1, 2, 3, 5, 4)]:
        g2.graph_def.node.add().CopyFrom(node)
    ix = g2.index()
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "a", "grp", "ctl", "d", "c"]
    # an inexpensive op Grappler keeps (a Shape) does hold it back, as in TF: it runs
    # inline first and the expensive op readied with it waits its turn as a task
    g.graph_def.node[2].op = "Shape"
    g.graph_def.node[2].input[:] = ["a"]
    ix = g.index()
    order = [ix.names[i] for i in executor_order(ix)]
    assert order[:3] == ["x", "a", "grp"] and order.index("d") < order.index("c")


def test_the_busiest_tower_is_the_highest_peak_of_devices_of_one_kind():
    from graphmem.analysis.towers import busiest_tower, gated_peak

    towers = {"": 5, "/device:CPU:0": 60, "/device:CPU:1": 70}
    assert busiest_tower(towers) == ("/device:CPU:1", 70)
    assert gated_peak(100, towers)[0] == 70
    # one device, or a swap's GPU and its host: no towers, the step's peak is the measure
    assert busiest_tower({"/device:GPU:0": 90, "/device:CPU:0": 40}) is None
    assert gated_peak(100, {"/device:GPU:0": 90, "/device:CPU:0": 40})[0] == 100
    assert busiest_tower({"": 100}) is None
