"""Kernel scratch buffers: the column buffers of TF's CPU convolution gradients, checked
against sizes traced on TF 2.21 (single ops, intra-op threads 1, oneDNN off), and counted
by the estimator while their op runs."""

import pytest

from graphmem.analysis import kernel_scratch
from graphmem.analysis.kernel_scratch import onednn_enabled, scratch_model
from graphmem.analysis.memory import estimate_memory
from tests.graphbuilder import G


def _conv_grads(n, h, w, c, k, f=3):
    """x[n,h,w,c] * filter[f,f,c,k], SAME, stride 1, and both gradients."""
    g = G()
    g.op("x", "Placeholder", shape=(n, h, w, c))
    g.op("filter", "Placeholder", shape=(f, f, c, k))
    g.op("dy", "Placeholder", shape=(n, h, w, k))
    g.op("sizes", "Const", shape=(4,))
    g.op("dx", "Conv2DBackpropInput", "sizes", "filter", "dy", shape=(n, h, w, c))
    g.op("dfilter", "Conv2DBackpropFilter", "x", "sizes", "dy", shape=(f, f, c, k))
    ix = g.index()
    scratch = scratch_model(ix, None, onednn=False)
    return scratch(ix.id_of["dx"]), scratch(ix.id_of["dfilter"])


def test_asking_for_the_scratch_leaves_the_graph_as_it_was():
    # a gradient without a data_format attr (TF's default, NHWC): asking for it must not
    # add an empty one, which TF refuses to import (a mixed-precision Keras step's
    # rewrite was written so on a CPU without oneDNN)
    g = G()
    g.op("filter", "Placeholder", shape=(3, 3, 4, 4))
    g.op("dy", "Placeholder", shape=(2, 8, 8, 4))
    g.op("sizes", "Const", shape=(4,))
    g.op("dx", "Conv2DBackpropInput", "sizes", "filter", "dy", shape=(2, 8, 8, 4))
    ix = g.index()
    before = ix.graph_def.SerializeToString()
    assert scratch_model(ix, None, onednn=False)(ix.id_of["dx"]) > 0
    assert "data_format" not in ix.node(ix.id_of["dx"]).attr
    assert ix.graph_def.SerializeToString() == before
    g.graph_def.node[-1].attr["data_format"].s = b"NCHW"  # Eigen's kernels are NHWC only
    assert scratch_model(g.index(), None, onednn=False)(ix.id_of["dx"]) == 0


def test_backprop_input_of_a_large_image_goes_one_image_at_a_time():
    # 32x32 pixels x (3*3*16) per image: the per-image work passes the L2 size, so the
    # column buffer holds one image: 1024 * 144 floats (traced: 589,824 bytes)
    dx, _ = _conv_grads(64, 32, 32, 16, 16)
    assert dx == 1024 * 144 * 4 == 589_824


def test_small_layers_ask_for_a_working_set_of_images():
    # 8x8 pixels x 288: work per image 64*32 + 288*32 + 64*288 = 29,696 floats, under
    # the L2's 65,536: ceil(30 MiB / 4 / 29,696) = 265 images in one buffer
    dx, dfilter = _conv_grads(32, 8, 8, 32, 32)
    assert dx == dfilter == 265 * 64 * 288 * 4 == 19_537_920
    # traced: 6,156,288 bytes for both gradients of a 4x4x64 -> 64 layer (167 images)
    dx, dfilter = _conv_grads(64, 4, 4, 64, 64)
    assert dx == dfilter == 167 * 16 * 576 * 4 == 6_156_288


def test_batch_of_one_is_one_image_for_the_input_gradient_only():
    dx, dfilter = _conv_grads(1, 8, 8, 4, 4)
    assert dx == 64 * 36 * 4  # traced: 9,216 bytes
    # the filter gradient always shards by the working set: 64*36 + 64*4 + 36*4 floats
    assert dfilter == -(-(30 << 20) // 4 // (64 * 36 + 64 * 4 + 36 * 4)) * 64 * 36 * 4


def _input_gradient(n, hw, c):
    """dx of an [n, hw, hw, c] -> c convolution, 3x3, SAME, and an op reading it."""
    g = G()
    g.op("filter", "Placeholder", shape=(3, 3, c, c))
    g.op("dy", "Placeholder", shape=(n, hw, hw, c))
    g.op("sizes", "Const", shape=(4,))
    g.op("dx", "Conv2DBackpropInput", "sizes", "filter", "dy", shape=(n, hw, hw, c))
    g.op("out", "Op", "dx", shape=(n, hw, hw, c))
    return g.index()


def test_onednn_kernels_are_not_charged():
    ix = _input_gradient(4, 8, 8)
    assert scratch_model(ix, None, onednn=True)(ix.id_of["dx"]) == 0
    assert scratch_model(ix, None, onednn=False)(ix.id_of["dx"]) > 0


def test_max_pool_gradient_keeps_an_int64_argmax_per_pooled_value():
    g = G()
    g.op("x", "Placeholder", shape=(-1, 32, 32, 32))
    g.op("y", "MaxPool", "x", shape=(-1, 16, 16, 32))
    g.op("dy", "Placeholder", shape=(-1, 16, 16, 32))
    g.op("dx", "MaxPoolGrad", "x", "y", "dy", shape=(-1, 32, 32, 32))
    ix = g.index()
    # traced at batch 32: 2,097,152 bytes
    assert scratch_model(ix, 32, onednn=False)(ix.id_of["dx"]) == 32 * 16 * 16 * 32 * 8
    assert scratch_model(ix, None, onednn=False)(ix.id_of["dx"]) == 0  # batch unknown


def test_the_estimate_holds_the_scratch_while_its_op_runs():
    ix = _input_gradient(32, 8, 32)
    inputs = 3 * 3 * 32 * 32 * 4 + 32 * 8 * 8 * 32 * 4
    # while dx runs: its inputs, its output and its 19.5 MB column buffer (requests)
    off = estimate_memory(ix, onednn=True, allocator=False).peak_bytes
    on = estimate_memory(ix, onednn=False, allocator=False)
    assert off == inputs + 32 * 8 * 8 * 32 * 4
    assert on.peak_bytes == off + 19_537_920
    assert on.peak_op == "dx"
    # as TF's allocator counts: the buffer needs a region of its own, which grows to
    # 32 MiB and is handed out whole (under twice the request), as traced for this op
    assert estimate_memory(ix, onednn=False).peak_bytes == off + 32 * 2**20


@pytest.mark.parametrize("value,expected", [("1", True), ("0", False), ("true", True)])
def test_tf_enable_onednn_opts_decides(monkeypatch, value, expected):
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", value)
    kernel_scratch.onednn_enabled.cache_clear()
    try:
        assert onednn_enabled() is expected
    finally:
        kernel_scratch.onednn_enabled.cache_clear()


def test_float16_gradients_take_eigens_scratch_where_onednn_cannot_run_them():
    # oneDNN runs float16 only with AVX512-FP16/AMX-FP16; elsewhere TF falls back to Eigen's
    # kernels, column buffers and all, even with oneDNN on (traced: 32 MiB per gradient of
    # a mixed_float16 Keras CNN)
    def grads(dtype):
        g = G()
        g.op("x", "Placeholder", shape=(32, 8, 8, 32), dtype=dtype)
        g.op("filter", "Placeholder", shape=(3, 3, 32, 32), dtype=dtype)
        g.op("dy", "Placeholder", shape=(32, 8, 8, 32), dtype=dtype)
        g.op("sizes", "Const", shape=(4,))
        g.op("dx", "Conv2DBackpropInput", "sizes", "filter", "dy", shape=(32, 8, 8, 32),
             dtype=dtype)
        return g.index()

    half, single = grads(19), grads(1)
    on_eigen = scratch_model(half, None, onednn=True, onednn_half=False)
    # 2-byte elements: twice the images of float32's 265 fit the working set
    assert on_eigen(half.id_of["dx"]) == 530 * 64 * 288 * 2
    assert scratch_model(half, None, onednn=True, onednn_half=True)(half.id_of["dx"]) == 0
    # float32 runs on oneDNN: no scratch, whatever the CPU does with float16
    assert scratch_model(single, None, onednn=True, onednn_half=False)(
        single.id_of["dx"]) == 0
