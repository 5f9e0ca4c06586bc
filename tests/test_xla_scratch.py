"""XLA's temporary buffer in a function call TF compiles (kernel_scratch.xla_call_scratch):
Keras 3 runs a grouped convolution through a jit-compiled call on CPU, and XLA computes a
depthwise one's filter gradient as a dense [k, k, C, C] convolution, twice the dense filter
held while the call runs (Keras ConvNeXtSmall's last stage: 220.5 MiB, which the estimate
missed at the rewritten step's peak)."""

from __future__ import annotations

import pytest

from tests.graphbuilder import G

B, SIDE, C, K = 2, 4, 256, 7


def _xla_call_graph(xla: bool, per_group: int = 1):
    g = G()
    g.op("x", "Placeholder", shape=(-1, SIDE, SIDE, C))
    g.op("dy", "Placeholder", shape=(-1, SIDE, SIDE, C))
    g.op("w", "Placeholder", shape=(K, K, per_group, C))
    call = g.op("grads", "PartitionedCall", "dy", "x", "w", n_out=2, shape=(K, K, per_group, C))
    call.attr["f"].func.name = "backward"
    if xla:
        call.attr["_XlaMustCompile"].b = True
    body = g.graph_def.library.function.add()
    body.signature.name = "backward"
    for name in ("dy", "x", "w"):
        body.signature.input_arg.add(name=name, type=1)
    conv = body.node_def.add(name="dw", op="Conv2DBackpropFilter", input=["x", "sizes", "dy"])
    shape = conv.attr["_output_shapes"].list.shape.add()
    for d in (K, K, per_group, C):
        shape.dim.add(size=d)
    return g.index(), g.graph_def.library


def test_a_depthwise_filter_gradient_compiled_by_xla_holds_twice_the_dense_filter():
    from graphmem.analysis.kernel_scratch import scratch_model, xla_call_scratch

    ix, library = _xla_call_graph(xla=True)
    call = ix.id_of["grads"]
    expected = 2 * (K * K * C * C * 4 + B * SIDE * SIDE * C * 4)
    assert xla_call_scratch(ix, B, library) == {call: expected}
    assert scratch_model(ix, B, onednn=True, library=library)(call) == expected
    assert scratch_model(ix, B, onednn=False, library=library)(call) == expected
    assert xla_call_scratch(*_xla_call_graph(xla=False)[:1], B, library) == {}  # no XLA
    # several channels per group: the filter stays grouped
    ix2, library2 = _xla_call_graph(xla=True, per_group=2)
    assert xla_call_scratch(ix2, B, library2) == {
        ix2.id_of["grads"]: 2 * (K * K * 2 * C * 4 + B * SIDE * SIDE * C * 4)}
    ix3, library3 = _xla_call_graph(xla=True, per_group=C)  # not grouped at all
    assert xla_call_scratch(ix3, B, library3) == {}


@pytest.mark.tf
def test_the_estimate_covers_the_measured_step_of_a_keras_grouped_convolution(tmp_path):
    """A Keras 3 depthwise convolution as `Conv2D(groups=C)` in a TF2 train step: the
    step's measured peak holds XLA's buffer, and the estimate is not below it."""
    from benchmarks.measure import measure_here
    from graphmem import api
    from tests.tf2_steps import _save_image_step

    path = _save_image_step(tmp_path / "grouped", SIDE, lambda keras: [
        keras.layers.Conv2D(C, 1), keras.layers.Conv2D(C, K, padding="same", groups=C),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)])
    dense = 2 * K * K * C * C * 4
    measured = measure_here(str(path), B, 1, 4)["highest"]
    assert measured >= dense  # the buffer is real: the weights are 40x smaller
    estimate = api.inspect(path, batch_size=B).estimated_peak_bytes
    assert measured * 0.97 <= estimate <= measured * 1.15
