"""oneDNN's workspaces (analysis/onednn_workspaces.py) and the first step's copies of
variables a TF1 session initialized from constants (variables.constant_initialized): two
causes of estimates below the measured peak on tf-slim ResNet-50 v2 (issue 24). Each is
checked by hand on tiny graphs, and against TensorFlow's allocator records of a small CNN
where TF runs oneDNN's kernels."""

from __future__ import annotations

import pytest

from graphmem.analysis import bfc
from graphmem.analysis import memory as memory_module
from graphmem.analysis.kernel_scratch import onednn_enabled
from graphmem.analysis.memory import estimate_memory
from graphmem.analysis.onednn_workspaces import Workspaces, onednn_workspaces
from graphmem.analysis.variables import constant_initialized
from tests.graphbuilder import G

BIG = (8, 56, 56, 64)  # 6.1 MiB of float32, 802,816 elements
POOLED = (8, 28, 28, 64)


def _pool(g: G, name: str, inp: str, window: int = 3) -> None:
    node = g.op(name, "MaxPool", inp, shape=POOLED)
    node.attr["ksize"].list.i.extend([1, window, window, 1])
    node.attr["strides"].list.i.extend([1, 2, 2, 1])


def _pool_graph(window: int = 3, grad: bool = True) -> G:
    g = G()
    g.op("x", "Placeholder", shape=BIG)
    _pool(g, "pool", "x", window)
    g.relu_loss("pool", POOLED)
    if grad:
        g.op("gradients/dx", "MaxPoolGrad", "x", "pool", "gradients/dy", shape=BIG)
        g.op("gradients/out", "Neg", "gradients/dx", shape=BIG)
    return g


def _batch_norm_graph(readers: int = 1, training: bool = True, control: bool = False) -> G:
    g = G()
    g.op("x", "Placeholder", shape=BIG)
    g.op("scale", "Placeholder", shape=(64,))
    g.op("offset", "Placeholder", shape=(64,))
    bn = g.op("bn", "FusedBatchNormV3", "x", "scale", "offset", shape=BIG, n_out=6)
    bn.attr["is_training"].b = training
    g.relu_loss("bn", BIG)
    if control:
        g.graph_def.node[-4].input.append("^scale")  # the Relu, with a control edge
    for k in range(1, readers):
        g.op(f"other{k}", "Neg", "bn", shape=BIG)
    g.op("gradients/dbn", "FusedBatchNormGradV3", "gradients/dy", "x", "scale", "bn:3",
         "bn:4", "bn:5", shape=BIG, n_out=6)
    g.op("gradients/out", "Neg", "gradients/dbn", shape=BIG)
    return g


def test_a_pooling_whose_gradient_is_computed_keeps_a_byte_per_output_element():
    ix = _pool_graph().index()
    found = onednn_workspaces(ix, None)
    pool, grad = ix.id_of["pool"], ix.id_of["gradients/dx"]
    assert found.bytes_of == {pool: 8 * 28 * 28 * 64}
    assert found.read_by == {pool: [grad]} and found.reads == {grad: [pool]}
    # a window of more than 255 elements: 32-bit positions
    assert onednn_workspaces(_pool_graph(window=16).index(), None).bytes_of == \
        {pool: 4 * 8 * 28 * 28 * 64}
    # no gradient reads it (inference, or a frozen layer): no workspace is kept
    assert not onednn_workspaces(_pool_graph(grad=False).index(), None)


def test_a_batch_norm_merged_with_its_relu_keeps_a_bit_per_element_as_floats():
    ix = _batch_norm_graph().index()
    bn = ix.id_of["bn"]
    # 3,211,264 elements -> 401,408 32-bit words of mask... held as floats: an eighth
    assert onednn_workspaces(ix, None).bytes_of == {bn: 4 * (8 * 56 * 56 * 64 // 8)}
    # what the remapper does not merge has no mask: a second reader of the output, a batch
    # norm in inference mode, a control edge on the relu
    for g in (_batch_norm_graph(readers=2), _batch_norm_graph(training=False),
              _batch_norm_graph(control=True)):
        assert not onednn_workspaces(g.index(), None)


def test_the_estimate_holds_a_workspace_to_its_gradient_in_the_highest_peak_only(
        monkeypatch):
    ix = _pool_graph().index()
    with_ws = estimate_memory(ix, onednn=True)
    monkeypatch.setattr(memory_module, "onednn_workspaces", lambda *a: Workspaces())
    without = estimate_memory(ix, onednn=True)
    ws = 8 * 28 * 28 * 64
    # the pooling's workspace is live from the pooling to its gradient, where the peak
    # is: the highest estimate counts it (chunks: at least its bytes more)
    assert with_ws.estimated_bytes >= without.estimated_bytes + ws
    # plans are still ranked without it (bfc.UNRANKED)
    assert with_ws.peak_bytes == without.peak_bytes
    assert any(t.name == "pool (oneDNN workspace)" for t in with_ws.live_at_peak)
    # where TF runs Eigen's kernels there is none
    monkeypatch.undo()
    assert estimate_memory(ix, onednn=False).estimated_bytes < with_ws.estimated_bytes


def _slots_graph() -> G:
    """A weight w initialized at random, a bias b and its momentum slot from constants,
    and their updates."""
    g = G()
    for v in ("w", "b", "b/Momentum"):
        node = g.op(v, "VarHandleOp", shape=())
        node.attr["dtype"].type = 1
        node.attr["shape"].shape.dim.add(size=4)
    g.op("w/random", "TruncatedNormal", shape=(4,))
    g.op("w/Assign", "AssignVariableOp", "w", "w/random", n_out=0)
    g.op("b/shape", "Const", shape=(1,))
    g.op("b/zero", "Const", shape=())
    g.op("b/zeros", "Fill", "b/shape", "b/zero", shape=(4,))
    g.op("b/Assign", "AssignVariableOp", "b", "b/zeros", n_out=0)
    g.op("b/Momentum/zeros", "Const", shape=(4,))
    g.op("b/Momentum/Assign", "AssignVariableOp", "b/Momentum", "b/Momentum/zeros",
         n_out=0)
    return g


def test_variables_initialized_from_constants_are_found():
    ix = _slots_graph().index()
    assert {ix.names[v] for v in constant_initialized(ix)} == {"b", "b/Momentum"}
    # an assignment inside the step is no initializer: its copy would recur every step
    step = {ix.id_of["b/Assign"], ix.id_of["b/Momentum/Assign"]}
    assert constant_initialized(ix, step) == frozenset()


def test_the_first_step_copies_a_variable_and_the_old_chunk_stays_in_use():
    mib = 1 << 20
    persistent = [("d", mib), ("d", 2 * mib)]
    # a step holding 3 MiB, and the first step's copy of variable 1 while it runs
    events = [("a", "d", 3 * mib, 0), ("copy", "d", 2 * mib, 1, 1), ("a", None)]
    allocators, owned, hosted = bfc._allocators(events, persistent, None)
    before = allocators["d"].in_use
    bfc._run_step(events, allocators, owned, hosted, False, first=True)
    assert allocators["d"].in_use == before + 2 * mib  # the copy, and the old chunk
    bfc._run_step(events, allocators, owned, hosted, False)
    assert allocators["d"].in_use == before + 2 * mib  # later steps copy nothing
    peaks = bfc.replay_step(events, persistent, None, False)
    # ranked without the copy; the highest over the steps after it is at least that
    assert peaks.peak == bfc.replay_step([ev for ev in events if len(ev) != 5],
                                         persistent, None, False).peak
    assert peaks.highest >= peaks.peak


def test_the_estimate_makes_the_copy_at_the_first_update_of_the_variable(monkeypatch):
    g = _slots_graph()
    g.op("x", "Placeholder", shape=(4,))
    g.op("upd_b", "ResourceApplyMomentum", "b", "b/Momentum", "x", "x", "x", n_out=0)
    ix = g.index()
    step = {ix.id_of[n] for n in ("b", "b/Momentum", "w", "x", "upd_b")}
    captured = []

    def replay(events, persistent, host, keep_timeline):
        captured.append(events)
        return bfc.replay_step(events, persistent, host, keep_timeline)

    monkeypatch.setattr(memory_module, "replay_step", replay)
    estimate_memory(ix, nodes=step, two_threads=False)
    copies = {(ev[2], ev[4]) for events in captured for ev in events if len(ev) == 5}
    assert len(copies) == 2  # b and its slot, each its own variable; w is not copied
    assert {b for b, _ in copies} == {256}  # 16 bytes, as the allocator rounds them


@pytest.mark.skipif(not onednn_enabled(), reason="TF runs Eigen's kernels on this CPU")
def test_against_tensorflow_s_allocator_records(tmp_path):
    """A small CNN (convolution, batch norm merged with its relu, max pooling, twice;
    momentum): the 1-D buffers TF allocates beside the pooling and batch norm outputs are
    the workspaces counted, and the buffers the first step leaves behind are the copies
    of the variables initialized from constants."""
    pytest.importorskip("tensorflow")
    from benchmarks.profiled_step import profiled_steps
    from benchmarks.trace_peak import _events
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    path = str(tmp_path / "cnn.meta")
    _build_cnn(path)
    batch = 4
    (_, ), (space, ) = profiled_steps(path, batch, 1, 1)
    allocs, live = {}, {}
    for _, kind, st in _events(space):
        if kind == "MemoryAllocation":
            live[st.get("addr")] = (st.get("tf_op"), int(st.get("requested_bytes") or 0))
            allocs.setdefault(st.get("tf_op"), []).append(
                (str(st.get("shape")), int(st.get("requested_bytes") or 0)))
        else:
            live.pop(st.get("addr"), None)
    ix = Workspace.open(load_model(path)).index
    found = onednn_workspaces(ix, batch)
    assert len(found.bytes_of) == 4  # two poolings, two batch norms
    for f, b in found.bytes_of.items():
        flat = [n for shape, n in allocs[ix.names[f]] if shape.count(",") == 0]
        assert b in flat, (ix.names[f], b, allocs[ix.names[f]])
    # what the first step left allocated: each update's copies of its variables
    left: dict[str, int] = {}
    for op, n in live.values():
        if "ResourceApply" in op:
            left[op] = left.get(op, 0) + n
    copied = constant_initialized(ix)
    expected = {}
    for i, op in enumerate(ix.ops):
        if op.startswith("ResourceApply"):
            b = sum(ix.tensor_bytes(ix.data_inputs[i][3], batch) or 0
                    for h in ix.data_inputs[i] if h[0] in copied)
            if b:
                expected[ix.names[i]] = b
    assert expected and left == expected


def _build_cnn(path: str) -> None:
    """Two blocks of convolution, batch norm (training), relu and 3x3 max pooling, a dense
    layer, momentum; weights initialized at random, batch norm parameters from constants."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 32, 32, 8], name="x")
        y = tf1.placeholder(tf.float32, [None, 10], name="y")
        h = x
        for k, c in enumerate((16, 32)):
            w = tf1.get_variable(f"w{k}", [3, 3, h.shape[-1], c], use_resource=True,
                                 initializer=tf1.glorot_uniform_initializer(seed=k))
            gamma = tf1.get_variable(f"g{k}", [c], initializer=tf1.ones_initializer(),
                                     use_resource=True)
            beta = tf1.get_variable(f"b{k}", [c], initializer=tf1.zeros_initializer(),
                                    use_resource=True)
            h, _, _ = tf1.nn.fused_batch_norm(tf.nn.conv2d(h, w, 1, "SAME"), gamma, beta,
                                              is_training=True)
            h = tf.nn.max_pool2d(tf.nn.relu(h), 3, 2, "SAME")
        wd = tf1.get_variable("wd", [32, 10], use_resource=True,
                              initializer=tf1.glorot_uniform_initializer(seed=9))
        logits = tf.reduce_mean(h, [1, 2]) @ wd
        loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(labels=y,
                                                                      logits=logits))
        tf1.add_to_collection("losses", loss)
        tf1.add_to_collection("train_op", tf1.train.MomentumOptimizer(0.01, 0.9)
                              .minimize(loss))
        tf1.global_variables_initializer()
        tf1.train.export_meta_graph(path)
