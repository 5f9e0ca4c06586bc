"""Pooling gradients first (passes/pool_first.py): `ReluGrad(MaxPoolGrad(x, pool, dp), x)`
becomes `MaxPoolGrad(x, pool, ReluGrad(dp, pool))`, which leaves x to the pooling gradient
alone, so TF's CPU kernel writes into x's buffer. Found on Keras' VGG19 at 224 px (issue 21):
block 1's pooling gradient, its input and output and the argmax scratch were the floor of
every plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmem.analysis.regions import analyze_regions
from graphmem.passes.pool_first import MIN_BYTES, apply_pool_first, pool_sites
from tests.graphbuilder import G


def _window(node, size: int) -> None:
    node.attr["ksize"].list.i.extend([1, size, size, 1])
    node.attr["strides"].list.i.extend([1, 2, 2, 1])
    node.attr["padding"].s = b"VALID"


def _relu_pool(side: int, other_reader: bool = False, window: int = 2) -> G:
    """x = Relu(y), p = MaxPool(x), and their gradients as TF builds them."""
    big, small = (1, side, side, 64), (1, side // 2, side // 2, 64)
    g = G()
    g.op("y", "Placeholder", shape=big)
    g.op("x", "Relu", "y", shape=big)
    _window(g.op("p", "MaxPool", "x", shape=small), 2)
    g.relu_loss("p", small, "gradients")
    _window(g.op("gradients/mpg", "MaxPoolGrad", "x", "p", "gradients/dy", shape=big), window)
    g.op("gradients/rg", "ReluGrad", "gradients/mpg", "x", shape=big)
    readers = ["gradients/rg"]
    if other_reader:
        g.op("gradients/other", "Neg", "gradients/mpg", shape=big)
        readers.append("gradients/other")
    g.op("gradients/out", "AddN", *readers, *readers[:1], shape=big)
    g.op("w", "VarHandleOp", shape=())
    g.op("apply_w", "ResourceApplyGradientDescent", "w", "gradients/out", shape=())
    return g


def test_a_pooling_gradient_and_its_relu_gradient_are_swapped():
    index = _relu_pool(256).index()
    sites = pool_sites(index, analyze_regions(index), None)
    assert [index.names[s.pool_grad] for s in sites] == ["gradients/mpg"]
    plan = apply_pool_first(index, sites)
    assert plan.pools == ["gradients/mpg"] and plan.bytes == 256 * 256 * 64 * 4
    nodes = {n.name: n for n in index.graph_def.node}
    scatter = nodes["gradients/mpg/graphmem_pool_first/max_pool_grad"]
    masked = nodes["gradients/mpg/graphmem_pool_first/relu_grad"]
    assert list(masked.input) == ["gradients/dy", "p"]
    assert list(scatter.input[:3]) == ["x", "p", masked.name]
    assert list(nodes["gradients/out"].input) == [scatter.name, scatter.name]


def test_the_estimate_counts_the_pooling_gradient_writing_into_its_input():
    """After the swap x is read last by the pooling gradient, which TF's CPU kernel writes
    into with Eigen's kernels (FIRST_INPUT_FORWARDING_OPS): the step's peak drops by x's
    buffer. oneDNN's kernel allocates its output: there the peak stays where it was."""
    from graphmem.analysis.memory import estimate_memory
    from graphmem.graph.index import GraphIndex
    from graphmem.graph.opdefs import OpRegistry

    g = _relu_pool(256)
    index = g.index()
    before = estimate_memory(index, allocator=False, onednn=False).peak_bytes
    before_onednn = estimate_memory(index, allocator=False, onednn=True).peak_bytes
    apply_pool_first(index, pool_sites(index, analyze_regions(index), None))
    index = GraphIndex.build(index.graph_def, OpRegistry(use_tensorflow=False))
    step = analyze_regions(index).step_nodes(index)  # the old pair is unread: TF prunes it
    assert "gradients/mpg" not in {index.names[i] for i in step}
    after = estimate_memory(index, nodes=step, allocator=False, onednn=False).peak_bytes
    x = 256 * 256 * 64 * 4
    assert x - 4096 <= before - after <= x  # (less a scalar's rounding, where peaks fall)
    after_onednn = estimate_memory(index, nodes=step, allocator=False, onednn=True).peak_bytes
    assert abs(after_onednn - before_onednn) <= 4096


def test_sites_that_do_not_qualify_are_left_alone():
    # the pooling gradient read by another op, a window that is not the pooling's, x small
    for g in (_relu_pool(256, other_reader=True), _relu_pool(256, window=3), _relu_pool(16)):
        index = g.index()
        assert not pool_sites(index, analyze_regions(index), None)
    assert 16 * 16 * 64 * 4 < MIN_BYTES


@pytest.mark.tf
@pytest.mark.parametrize("policy", ["none", "memory"])
def test_a_rewrite_with_pooling_gradients_first_trains_the_same(policy, tmp_path_factory):
    """Bit for bit, Grappler off and on, at one and two inter-op threads (values compare
    equal; a zero's sign may differ, which verify's comparison and training ignore), and
    the estimate drops by the pooled input the kernel now writes into."""
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.decayed_models import trained_alike
    from tests.test_fusion_guard import biased_convnet

    batch = 8
    src = biased_convnet(tmp_path_factory.mktemp("pf") / "cnn.meta", (16, 16, 32, 32),
                         side=64)
    out = Path(tmp_path_factory.mktemp("pf_out")) / "out.meta"
    options = RewriteOptions(policy, [], batch)
    options.keep_worse = True
    result = rewrite_file(src, out, options)
    plan = result.passes["pool first"]
    assert len(plan.pools) == 2 and plan.bytes == batch * 64 * 64 * 16 * 4 + \
        batch * 32 * 32 * 32 * 4
    trained_alike(src, out, batch)
    for threads in (1, 2):
        r = verify(str(src), str(out), RunSpec(batch_size=batch, grappler=True,
                                               inter_op_threads=threads), 3, 0.0, 0.0)
        assert r.same_training and r.max_variable_diff == 0, r.mismatches
    if policy == "none":
        options.early_updates = False  # the pass is one of the in-place family
        plain = rewrite_file(src, Path(tmp_path_factory.mktemp("pf_plain")) / "o.meta",
                             options)
        assert "pool first" not in plain.passes
