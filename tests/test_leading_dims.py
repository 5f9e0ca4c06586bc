"""Leading dimensions that are not the batch size (graph/leading_dims.py): a reshape's
`[-1, n]` over batch x positions, and the matmuls of a `Tensordot` (Keras' `Dense` on a
3-D input), sized with their real row counts instead of the batch size."""

from __future__ import annotations

import os

import pytest

from tests.graphbuilder import G

B, T, D, N = 4, 16, 8, 32


def _tensordot_graph() -> G:
    """x[B, T, D] -> reshape [-1, D] -> matmul [D, N] -> bias add; the same through a
    reshape whose static shape is unknown (`[-1, -1]`, as `Tensordot` writes it); and the
    weight gradient, a matmul that reads that reshape transposed."""
    g = G()
    g.op("x", "Placeholder", shape=(-1, T, D))
    g.op("w", "Placeholder", shape=(D, N))
    g.op("b", "Placeholder", shape=(N,))
    g.op("to_rows", "Const", shape=(2,))
    g.op("rows", "Reshape", "x", "to_rows", shape=(-1, D))
    g.op("mm", "MatMul", "rows", "w", shape=(-1, N))
    g.op("out", "BiasAdd", "mm", "b", shape=(-1, N))
    g.op("act", "Relu", "out", shape=(-1, N))
    g.op("pack", "Pack", shape=(2,))
    g.op("dyn_rows", "Reshape", "x", "pack", shape=(-1, -1))
    g.op("dyn_mm", "MatMul", "dyn_rows", "w", shape=(-1, N))
    g.op("dw", "MatMul", "dyn_rows", "act", shape=(-1, N)).attr["transpose_a"].b = True
    g.op("flat", "Reshape", "x", "to_rows", shape=(-1, T * D))  # rows: the batch
    g.op("first", "StridedSlice", "mm", "to_rows", shape=(-1, N))  # its own rows
    return g


def test_reshaped_rows_are_sized_as_batch_times_positions():
    ix = _tensordot_graph().index()
    t = {name: (ix.id_of[name], 0) for name in ix.names}
    found = ix.leading_dims(B)
    for name in ("rows", "mm", "out", "act", "dyn_mm"):
        assert found[t[name]] == B * T, name
        assert ix.tensor_bytes(t[name], B) == B * T * ix.shape(t[name])[1] * 4
    assert found[t["dw"]] == D  # the weight gradient: [D, N], not [B, N]
    assert ix.static_shape(t["dw"], B) == [D, N]
    assert t["flat"] not in found and ix.tensor_bytes(t["flat"], B) == B * T * D * 4
    assert t["first"] not in found  # a slice's rows are not its input's
    assert ix.output_bytes(B)(t["mm"][0]) == [B * T * N * 4]
    # reports show the resolved rows; a batch dimension stays unknown (`?`)
    assert ix.shape_at(t["mm"], B) == [B * T, N] and ix.shape_at(t["flat"], B) == [-1, T * D]
    assert ix.leading_dims(None) == {} and ix.tensor_bytes(t["mm"], None) is None


def test_graphs_without_reshapes_resolve_nothing():
    g = G()
    g.op("x", "Placeholder", shape=(-1, D))
    g.op("w", "Placeholder", shape=(D, N))
    g.op("mm", "MatMul", "x", "w", shape=(-1, N))
    ix = g.index()
    assert ix.leading_dims(B) == {}
    assert ix.tensor_bytes((ix.id_of["mm"], 0), B) == B * N * 4


@pytest.mark.tf
def test_resolved_rows_match_tensorflow_at_run_time(tmp_path):
    """Every tensor of a TF1 step whose static shape is `[-1, known...]` (tensordots, a
    dense layer on their output, their gradients): its run-time leading dimension is the
    one the index sizes it with."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, T, D], name="x")
        w1 = v1.get_variable("w1", [D, N], use_resource=True)
        w2 = v1.get_variable("w2", [N, D], use_resource=True)
        h = tf.nn.relu(tf.tensordot(x, w1, [[2], [0]]))
        h = tf.tensordot(h, w2, [[2], [0]]) + x
        head = v1.get_variable("head", [T * D, 3], use_resource=True)
        loss = tf.reduce_sum(tf.matmul(tf.reshape(h, [-1, T * D]), head) ** 2)
        train = v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        graph_def = g.as_graph_def(add_shapes=True)
        path = tmp_path / "tensordot.meta"
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=graph_def)
        ix = Workspace.open(load_model(path)).index
        found = ix.leading_dims(B)
        checked = [(i, k) for i in range(len(ix)) for k, s in enumerate(ix.shapes_of(i) or ())
                   if s and s[0] < 0 and all(d >= 0 for d in s[1:])
                   and ix.dtype((i, k)) == tf.float32.as_datatype_enum]
        with v1.Session(graph=g) as sess:
            sess.run(v1.global_variables_initializer())
            values = sess.run([g.get_tensor_by_name(ix.tensor_name(t)) for t in checked],
                              {x: np.ones([B, T, D], np.float32)})
    assert sum(found.get(t, B) != B for t in checked) >= 4  # tensordots' rows among them
    for t, value in zip(checked, values, strict=True):
        assert value.shape[0] == found.get(t, B), ix.tensor_name(t)
