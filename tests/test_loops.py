"""Loops in the estimate: trip counts and what a loop accumulates for its gradient.

Hand-made control flow v1 graphs (no TensorFlow) whose peak is worked out by hand, and
small loops built with TensorFlow (v1 stacks, v2 tensor lists) whose accumulated bytes are
known from their shapes. Tensors are float32[2048] (U = 8 KiB); counters, handles and
booleans are given shape [0] so that they weigh nothing and the arithmetic stays in U.
"""

import pytest

from graphmem import protos
from graphmem.analysis.loops import analyze_loops, const_ints, trip_from_compare
from graphmem.analysis.memory import estimate_memory, loop_body_peak
from tests.graphbuilder import G

U = 8192
N = (2048,)
S = (0,)  # a scalar that weighs nothing
INT32 = 3


def _const(g: G, name: str, value: int, *ctrl: str):
    node = g.op(name, "Const", *ctrl, shape=S, dtype=INT32)
    node.attr["dtype"].type = INT32
    node.attr["value"].tensor.dtype = INT32
    node.attr["value"].tensor.int_val.append(value)
    return node


def _enter(g: G, name: str, src: str, frame: bytes, constant: bool, shape=S):
    node = g.op(name, "Enter", src, shape=shape, frame_name=frame)
    node.attr["is_constant"].b = constant
    return node


def _counter_loop(g: G, p: str, frame: bytes, start: str, bound: str, step_op: str,
                  compare: str) -> None:
    """`i = start; while i <compare> bound: i = i <step_op> 1`, nodes named p/..."""
    _enter(g, f"{p}/i_enter", start, frame, False)
    g.op(f"{p}/i_merge", "Merge", f"{p}/i_enter", f"{p}/i_next", shape=S, n_out=2)
    _enter(g, f"{p}/n_enter", bound, frame, True)
    g.op(f"{p}/cmp", compare, f"{p}/i_merge", f"{p}/n_enter", shape=S)
    g.op(f"{p}/cond", "LoopCond", f"{p}/cmp", shape=S)
    g.op(f"{p}/i_switch", "Switch", f"{p}/i_merge", f"{p}/cond", shape=S, n_out=2)
    g.op(f"{p}/i", "Identity", f"{p}/i_switch:1", shape=S)
    _const(g, f"{p}/one", 1, f"^{p}/i")
    g.op(f"{p}/i_step", step_op, f"{p}/i", f"{p}/one", shape=S)
    g.op(f"{p}/i_next", "NextIteration", f"{p}/i_step", shape=S)
    g.op(f"{p}/i_exit", "Exit", f"{p}/i_switch", shape=S)


def v1_stack_graph(static_bound: bool = True) -> G:
    """A forward loop of 5 steps computes h = Op(x) and pushes it on a stack; the gradient
    loop counts down from the forward count, pops h and computes g = Op(h), which leaves
    the loop and is read by `after`."""
    g = G()
    g.op("x", "Placeholder", shape=N)
    _const(g, "zero", 0)
    if static_bound:
        _const(g, "five", 5)
    else:
        g.op("five", "Placeholder", shape=S, dtype=INT32)
    g.op("stack", "StackV2", "five", shape=S)
    _counter_loop(g, "fwd", b"fwd", "zero", "five", "Add", "Less")
    _enter(g, "fwd/x_enter", "x", b"fwd", True, shape=N)
    g.op("fwd/h", "Op", "fwd/x_enter", "^fwd/i", shape=N)
    _enter(g, "fwd/stack_enter", "stack", b"fwd", True)
    g.op("fwd/push", "StackPushV2", "fwd/stack_enter", "fwd/h", shape=N)
    _const(g, "bwd_zero", 0)
    _counter_loop(g, "bwd", b"bwd", "fwd/i_exit", "bwd_zero", "Sub", "Greater")
    _enter(g, "bwd/stack_enter", "stack", b"bwd", True)
    g.op("bwd/pop", "StackPopV2", "bwd/stack_enter", "^bwd/i", shape=N)
    g.op("bwd/g", "Op", "bwd/pop", shape=N)
    g.op("bwd/g_exit", "Exit", "bwd/g", shape=N)
    g.op("after", "Op", "bwd/g_exit", shape=N)
    return g


def test_v1_trip_counts_of_a_counting_loop_and_its_gradient_loop():
    facts = analyze_loops(v1_stack_graph().index(), None)
    trips = {lp.name: (lp.trip_count, lp.accumulators) for lp in facts.loops}
    assert trips == {"fwd": (5, 1), "bwd": (5, 0)}  # bwd counts down from fwd's final 5


def test_v1_stack_holds_every_step_until_the_gradient_loop_ends():
    ix = v1_stack_graph().index()
    est = estimate_memory(ix, keep_timeline=True)
    # at h: x + h + the 4 earlier steps of the stack = 6U; at g: the 4 earlier steps,
    # the popped h (its own buffer, handed back by the pop) and g = 6U again
    assert est.peak_bytes == 6 * U
    assert est.timeline[-1] == 2 * U  # g and `after`: the stack went with the gradient loop
    names = {t.name: t.bytes for t in est.live_at_peak}
    assert names["fwd/push (4 earlier steps)"] == 4 * U
    assert est.notes == []


def test_v1_exit_runs_after_its_loop_body():
    """The order runs a body once; an Exit is ready right after its Switch but must wait
    for the body, or the gradient loop would pop before the forward loop pushed."""
    from graphmem.analysis.schedule import executor_order

    ix = v1_stack_graph().index()
    pos = {ix.names[i]: p for p, i in enumerate(executor_order(ix))}
    assert pos["fwd/i_exit"] > max(pos["fwd/h"], pos["fwd/push"], pos["fwd/i_next"])
    assert pos["bwd/pop"] > pos["fwd/push"]


def test_v1_unknown_trip_count_is_reported_and_counted_as_one_step():
    ix = v1_stack_graph(static_bound=False).index()
    est = estimate_memory(ix)
    assert est.peak_bytes == 2 * U  # x + h, then h + g, then g + after
    assert len(est.notes) == 1
    assert "loop fwd: trip count unknown" in est.notes[0]
    assert "accumulators counted as one step" in est.notes[0]


def test_static_values_and_trip_arithmetic():
    node = protos.GraphDef().node.add(name="c", op="Const")
    node.attr["value"].tensor.dtype = INT32
    node.attr["value"].tensor.tensor_shape.dim.add(size=3)
    node.attr["value"].tensor.int_val.append(7)
    assert const_ints(node) == [7, 7, 7]  # TF writes a repeated value once
    empty = protos.GraphDef().node.add(name="z", op="Const")
    empty.attr["value"].tensor.dtype = INT32
    assert const_ints(empty) == 0  # no value written: zero
    assert trip_from_compare("Less", 0, 1, 12) == 12
    assert trip_from_compare("LessEqual", 0, 1, 12) == 13
    assert trip_from_compare("Less", 0, 5, 12) == 3
    assert trip_from_compare("GreaterEqual", 12, -1, 1) == 12
    assert trip_from_compare("Less", 0, -1, 12) is None  # never reaches the bound


# ---- loops built with TensorFlow --------------------------------------------------------
T, B, W = 7, 8, 256  # trip count, batch, width: one step's tensor is B*W*4 = 8 KiB


def _tf_loop_graph(v2: bool):
    """h_{t+1} = tanh(h_t * w), T steps, gradient wrt w. The gradient needs, per step,
    h_t (for d/dw of the product) and tanh's output (for TanhGrad): 2 x 8 KiB a step."""
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    (v1.enable_control_flow_v2 if v2 else v1.disable_control_flow_v2)()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, [None, W], name="x")
            w = v1.get_variable("w", [W], initializer=v1.ones_initializer(), use_resource=True)
            _, h = tf.while_loop(lambda i, h: i < T, lambda i, h: (i + 1, tf.tanh(h * w)),
                                 [tf.constant(0), x])
            loss = tf.reduce_sum(h)
            v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        graph_def = graph.as_graph_def(add_shapes=True)
    finally:
        v1.enable_control_flow_v2()
    from graphmem.graph.index import GraphIndex
    from graphmem.graph.opdefs import OpRegistry

    graph_def_ours = protos.GraphDef()
    graph_def_ours.ParseFromString(graph_def.SerializeToString())
    graph_def = graph_def_ours
    return GraphIndex.build(graph_def, OpRegistry.for_graph(graph_def))


def test_tf_v1_loop_stacks_are_sized_by_the_trip_count():
    ix = _tf_loop_graph(v2=False)
    facts = analyze_loops(ix, B)
    forward = [lp for lp in facts.loops if lp.accumulators]
    assert [lp.trip_count for lp in forward] == [T]
    step = B * W * 4
    pushed = {ix.tensor_name(ix.data_inputs[p][1]): n for p, n in facts.push_steps.items()
              if ix.shape(ix.data_inputs[p][1]) == [-1, W]}
    assert sorted(pushed.values()) == [T, T]  # h_t and tanh(h_t * w)
    est = estimate_memory(ix, B, top=20)
    stacks = sum(t.bytes for t in est.live_at_peak if "earlier steps" in t.name
                 and t.shape == [T - 1, -1, W])
    assert stacks == 2 * (T - 1) * step
    assert est.peak_bytes >= 2 * T * step


def test_tf_v2_loop_accumulators_are_sized_by_the_trip_count():
    ix = _tf_loop_graph(v2=True)
    facts = analyze_loops(ix, B, body_peak=loop_body_peak)  # as the estimate asks
    forward = [lp for lp in facts.loops if lp.accumulators]
    assert len(forward) == 1 and forward[0].trip_count == T and forward[0].kind == "v2"
    step = B * W * 4
    w = ix.id_of[forward[0].name]
    lists = sorted(b for (i, _), b in facts.output_bytes.items() if i == w and b >= step)
    assert lists == [T * step, T * step]  # h_t and tanh(h_t * w), T steps each
    assert facts.body_peak[w] > 0  # one iteration's own tensors while the While runs
    est = estimate_memory(ix, B)
    assert est.peak_bytes >= 2 * T * step
    assert est.notes == []


def test_keras_lstm_train_step_is_found_and_its_loop_sized(tmp_path):
    """A TF2 SavedModel whose train step runs a Keras LSTM (a v2 While in the step's
    function): the loop's body and gradient functions are not taken for train steps, and
    the loop's accumulators are counted for its 20 steps."""
    tf = pytest.importorskip("tensorflow")
    import json

    from tests.conftest import run_cli

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.lstm = tf.keras.layers.LSTM(32)
            self.dense = tf.keras.layers.Dense(4)
            self.opt = tf.keras.optimizers.SGD(0.1)
            self.lstm.build((None, 20, 8))
            self.dense.build((None, 32))

        @tf.function(input_signature=[tf.TensorSpec([None, 20, 8], tf.float32),
                                      tf.TensorSpec([None], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.dense(self.lstm(x))
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True))
            variables = self.lstm.trainable_variables + self.dense.trainable_variables
            self.opt.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
            return loss

    step = Step()
    tf.saved_model.save(step, str(tmp_path / "sm"), signatures={"train_step": step.train_step})
    result = run_cli("inspect", tmp_path / "sm", "--batch-size", "16", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["model"]["function"].startswith("__inference_train_step")
    loops = doc["control_flow"]["loops"]
    forward = [lp for lp in loops if lp["accumulators"]]
    assert [lp["trip_count"] for lp in forward] == [20]
    assert doc["estimate_notes"] == []
    # one step of the cell keeps at least its input and state, 16 x (8 + 32) floats, for
    # each of the 20 steps
    assert doc["estimated_peak_bytes"] >= 20 * 16 * (8 + 32) * 4


def test_grappler_lowered_v2_loop_keeps_its_sizes():
    """On Grappler's graph a v2 While is lowered to v1 frames whose tensor lists carry the
    accumulators: the trip count is still found and the lists are sized like stacks."""
    pytest.importorskip("tensorflow")
    from graphmem.analysis.inspect import gather_facts
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from tests.conftest import fixture_path

    ws = Workspace.open(load_model(fixture_path("lstm_v2")), batch_size=64)
    graph, _ = gather_facts(ws, 64)
    lowered, _ = gather_facts(ws, 64, grappler=True)
    forward = [lp for lp in lowered.control_flow["loops"] if lp.accumulators]
    assert [(lp.kind, lp.trip_count) for lp in forward] == [("v1", 12)]
    assert lowered.estimate_notes == []
    # both hold the 12 steps of the cell's gates, states and inputs (~0.9 MiB): within
    # 15% of each other
    assert 0.85 < lowered.estimated_peak_bytes / graph.estimated_peak_bytes < 1.15


# ---- iterations run ahead of a gradient loop's running sums ------------------------------
RW = 384  # a [RW, RW] float32 weight: 576 KiB, a term large enough to run ahead
RT = 8  # steps; tf.while_loop's parallel_iterations is 10, so 7 iterations run ahead


def _v2_matmul_loop():
    """h_{t+1} = tanh(h_t . w), RT steps, control flow v2: the gradient loop sums w's
    gradient over the iterations (`sum + h_t^T . d_z`), a term as large as w."""
    tf = pytest.importorskip("tensorflow")
    v1 = tf.compat.v1
    v1.enable_control_flow_v2()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, RW], name="x")
        w = v1.get_variable("w", [RW, RW], initializer=v1.glorot_uniform_initializer(),
                            use_resource=True)
        _, h = tf.while_loop(lambda i, h: i < RT,
                             lambda i, h: (i + 1, tf.tanh(tf.matmul(h, w))),
                             [tf.constant(0), x])
        v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(h))
    from graphmem.graph.index import GraphIndex
    from graphmem.graph.opdefs import OpRegistry

    graph_def = protos.GraphDef()
    graph_def.ParseFromString(graph.as_graph_def(add_shapes=True).SerializeToString())
    return graph_def, GraphIndex.build(graph_def, OpRegistry.for_graph(graph_def))


def test_iterations_run_ahead_of_a_gradient_loops_running_sum():
    """Each gradient iteration's term waits for the Add of the sum, and up to
    parallel_iterations of them exist at once (a Keras LSTM LM traced with 32 kernel-sized
    terms live): the estimate counts parallel_iterations - 1 more terms, each its own
    allocation, while the gradient While runs."""
    _, ix = _v2_matmul_loop()
    facts = analyze_loops(ix, B, body_peak=loop_body_peak)
    term = RW * RW * 4
    grad = [lp for lp in facts.loops if lp.run_ahead_bytes]
    assert len(grad) == 1 and "while_grad" in grad[0].name
    assert grad[0].run_ahead_bytes == (RT - 1) * term
    assert facts.run_ahead[ix.id_of[grad[0].name]] == [term] * (RT - 1)
    # the forward loop sums nothing
    assert all(lp.run_ahead_bytes == 0 for lp in facts.loops if lp is not grad[0])
    # the gradient body's own iteration holds one term more
    assert estimate_memory(ix, B).peak_bytes >= RT * term


def _rewrite_matmul_loop(tmp_path, batch: int):
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.rewrite import RewriteOptions, rewrite_file

    graph_def, _ = _v2_matmul_loop()
    meta = protos.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    src, out = tmp_path / "loop.meta", tmp_path / "out.meta"
    src.write_bytes(meta.SerializeToString())
    result = rewrite_file(src, out, RewriteOptions("memory", [], batch))
    assert not result.reverted
    ws = Workspace.open(load_model(out), batch_size=batch)
    return result, ws.index


def test_held_running_sums_do_not_run_ahead(tmp_path):
    """The loop-bodies rewrite makes each term wait for the incoming sum: one term at a
    time, so no iterations' terms are counted beyond the body's own; what each iteration
    ahead holds instead is the waiting term's inputs (h_t and d_z, [B, RW] each)."""
    result, ix = _rewrite_matmul_loop(tmp_path, B)
    (fact,) = result.loops.loops
    assert fact.sums_held_back == 1
    facts = analyze_loops(ix, B, body_peak=loop_body_peak)
    step = B * RW * 4
    assert list(facts.run_ahead.values()) == [[step, step] * (RT - 1)]
    ahead = (RT - 1) * RW * RW * 4
    assert result.before.estimated_bytes >= ahead
    assert result.after.estimated_bytes <= result.before.estimated_bytes - ahead + \
        2 * (RT - 1) * step


def test_running_sums_are_left_to_run_ahead_when_their_inputs_are_larger(tmp_path):
    """At a batch where a term's two inputs ([batch, RW] each) outweigh the term ([RW, RW]),
    a term waiting for the sum would hold more in each iteration ahead than the term does:
    the rewrite leaves the sum alone, and the estimate counts the terms running ahead
    (the fixtures' lstm_v2 at batch 64 measured the same either way, findings.md)."""
    batch = 256  # 2 x 256 x 384 floats of inputs against 384 x 384 of term
    result, ix = _rewrite_matmul_loop(tmp_path, batch)
    (fact,) = result.loops.loops
    assert fact.sums_held_back == 0
    facts = analyze_loops(ix, batch, body_peak=loop_body_peak)
    assert list(facts.run_ahead.values()) == [[RW * RW * 4] * (RT - 1)]
