"""Late weight gradients (passes/late_gradients.py): a weight gradient far larger than its
inputs (a VGG's first dense layer) waits for the backward pass's lowest point instead of
running, with its update, at the top of the backward pass beside every checkpoint.
Found on Keras' VGG16 at 224 px (issue 21): fc1's 392 MiB gradient and the optimizer's
392 MiB `momentum * velocity` were the rewritten step's estimated peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmem.analysis.large_gradients import MIN_BYTES, large_gradients
from graphmem.analysis.regions import analyze_regions
from graphmem.passes.late_gradients import LateGradientsPass
from tests.graphbuilder import G

BATCH = 8


@pytest.fixture(scope="module")
def vgg_head(tmp_path_factory) -> Path:
    from tests.tf2_steps import save_vgg_head_step

    return save_vgg_head_step(tmp_path_factory.mktemp("late") / "vgg")


def _rewrite(src: Path, out: Path, policy: str = "memory", batch: int = BATCH):
    from graphmem.rewrite import RewriteOptions, rewrite_file

    options = RewriteOptions(policy, [], batch)
    options.keep_worse = True  # the edges are what is tested, whatever the estimate says
    return rewrite_file(src, out, options)


@pytest.mark.tf
def test_the_dense_weight_gradient_waits_and_the_estimate_drops(vgg_head, tmp_path,
                                                                 monkeypatch):
    result = _rewrite(vgg_head, tmp_path / "late", "none")
    plan = result.passes["late gradients"]
    # fc1's weight gradient (named fc1 or fc1_1 by Keras' tracing), not the head's
    assert [m.gradient.split("/")[-3].split("_")[0] for m in plan.moved] == ["fc1"], plan
    assert plan.moved[0].bytes == 16 * 16 * 64 * 512 * 4
    assert plan.dropped_edges >= 1  # its early update's edge into the backward pass
    # the same rewrite without the pass peaks higher: the gradient and its update's
    # temporaries met the forward activations at the top of the backward pass
    monkeypatch.setattr(LateGradientsPass, "enabled", lambda self, options: False)
    without = _rewrite(vgg_head, tmp_path / "without", "none")
    assert "late gradients" not in without.passes
    assert result.after.peak_bytes < 0.9 * without.after.peak_bytes


@pytest.mark.tf
def test_the_rewrite_trains_the_same(vgg_head, tmp_path):
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    out = tmp_path / "out"
    result = _rewrite(vgg_head, out)
    assert result.passes["late gradients"].moved
    for grappler in (False, True):
        r = verify(str(vgg_head), str(out), RunSpec(batch_size=BATCH, grappler=grappler), 3,
                   0.0, 0.0)
        assert r.same_training and r.max_variable_diff == 0, (grappler, r.mismatches)


def _dense_gradient(rows: int, cols: int, batch: int, weight_read: bool = False,
                    all_reduced: bool = False) -> G:
    """x (batch x rows) and dy (batch x cols) -> dW = x^T dy (rows x cols), applied to w.
    With `weight_read`, the gradient also feeds the backward chain (dx reads it), so it is
    not a weight gradient's own; with `all_reduced`, an all-reduce sums it first."""
    g = G()
    g.op("x", "Placeholder", shape=(batch, rows))
    g.relu_loss("x", (batch, rows), "gradient_tape")
    g.op("proj", "Placeholder", shape=(rows, cols))
    g.op("gradient_tape/dy_small", "MatMul", "gradient_tape/dy", "proj", shape=(batch, cols))
    g.op("gradient_tape/dw", "MatMul", "x", "gradient_tape/dy_small", shape=(rows, cols))
    g.op("w", "VarHandleOp", shape=())
    grad = "gradient_tape/dw"
    if all_reduced:  # a data-parallel replica's: summed over the replicas first
        g.op("gradient_tape/dw_sum", "CollectiveReduceV2", grad, shape=(rows, cols))
        grad = "gradient_tape/dw_sum"
    g.op("apply_w", "ResourceApplyGradientDescent", "w", grad, shape=())
    if weight_read:
        g.op("gradient_tape/dx", "MatMul", "gradient_tape/dw", "gradient_tape/dy_small",
             shape=(rows, batch))
        g.op("gradient_tape/more", "MatMul", "gradient_tape/dx", "x", shape=(rows, rows))
        g.op("v", "VarHandleOp", shape=())
        g.op("apply_v", "ResourceApplyGradientDescent", "v", "gradient_tape/more", shape=())
    return g


def test_candidates_are_large_gradients_of_small_inputs_read_by_their_update_alone():
    rows, cols = 4096, 2048  # 32 MiB from 8 x 4096 and 8 x 2048
    assert rows * cols * 4 >= MIN_BYTES
    index = _dense_gradient(rows, cols, 8).index()
    regions = analyze_regions(index)
    found = large_gradients(index, regions, regions.step_nodes(index), None)
    assert [index.names[c.op] for c in found] == ["gradient_tape/dw"]
    assert found[0].bytes == rows * cols * 4
    assert index.id_of["apply_w"] in found[0].own_ops
    # too small
    index = _dense_gradient(512, 512, 8).index()
    regions = analyze_regions(index)
    assert not large_gradients(index, regions, regions.step_nodes(index), None)
    # inputs not much smaller than the output: batch 1024 makes x 16 MiB
    index = _dense_gradient(rows, cols, 1024).index()
    regions = analyze_regions(index)
    assert not large_gradients(index, regions, regions.step_nodes(index), None)
    # all-reduced: moving it could change the replicas' collective order
    index = _dense_gradient(rows, cols, 8, all_reduced=True).index()
    regions = analyze_regions(index)
    assert not large_gradients(index, regions, regions.step_nodes(index), None)
    # read by the backward chain, not only by its update
    index = _dense_gradient(rows, cols, 8, weight_read=True).index()
    regions = analyze_regions(index)
    assert "gradient_tape/dw" not in {index.names[c.op] for c in
                                      large_gradients(index, regions,
                                                      regions.step_nodes(index), None)}


@pytest.mark.tf
def test_copies_wait_for_the_filter_gradient_beside_their_trigger(vgg_head, tmp_path,
                                                                 monkeypatch):
    """A `GradientTape` builds no gradient tuples: the filter gradient (and the bias
    gradient TF merges with it) reading the incoming gradient of a trigger is a trigger
    too (recompute.py, `_weight_gradients_beside`), or the incoming gradient stays alive
    through the next segment's recomputation. (The speed plan's checkpoints stay at the
    convolutions' `BiasAdd` here, so that ReLUs are recomputed: since 2026-11-30 such a
    checkpoint moves to the ReLU TF merges with it, and nothing is left to recompute.)"""
    import graphmem.passes.recompute as recompute
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    monkeypatch.setattr(recompute, "_past_merged_chains", lambda index, cps: (cps, 0))
    out = tmp_path / "speed"
    result = _rewrite(vgg_head, out, "speed")
    beside = 0
    for seg in result.plan.segments:
        for t in seg.triggers:
            if t.endswith("/convolution/Conv2DBackpropFilter"):
                layer = t.rsplit("/", 2)[0]
                # beside the input gradient it shares its incoming gradient with, and with
                # the bias gradient TF merges it with
                assert f"{layer}/convolution/Conv2DBackpropInput" in seg.triggers, seg
                assert f"{layer}/BiasAdd/BiasAddGrad" in seg.triggers, seg
                beside += 1
    # (a filter gradient that reads the copies, or a segment held back one segment ahead,
    # has none)
    assert beside >= 1, result.plan.segments
    r = verify(str(vgg_head), str(out), RunSpec(batch_size=BATCH, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches


@pytest.mark.tf
def test_a_gated_tf1_gradient_leaves_its_gate_and_trains_the_same(tmp_path, monkeypatch):
    """tf.gradients' default gate (GATE_OP) makes a convolution's input gradient wait for
    its filter gradient, so the whole backward chain below depends on fc's 64 MiB filter
    gradient, and only leaving the gate lets it wait (tf-slim's AlexNet and OverFeat, found
    at 224 px). Its weight-decay term, added in place piece by piece, keeps its order
    behind the gradient (or the pieces would be computed early and wait beside it)."""
    from tests.decayed_models import decayed_conv_head, trained_alike

    src = decayed_conv_head(tmp_path / "head.meta", 32)
    result = _rewrite(src, tmp_path / "out.meta", "none", batch=32)
    plan = result.passes["late gradients"]
    assert [m.gradient for m in plan.moved] == ["gradients/Conv2D_1_grad/Conv2DBackpropFilter"]
    assert plan.ungated == 1 and result.passes["in-place terms"].terms
    # out of the gate, which still holds the input gradient: the fc weight's update still
    # waits for it (it reads the weight); the gradient waits for a later backward op
    from graphmem.formats.load import load_model

    nodes = {n.name: n for n in load_model(tmp_path / "out.meta").graph_def.node}
    grad = "gradients/Conv2D_1_grad/"
    assert list(nodes[grad + "tuple/group_deps"].input) == ["^" + grad + "Conv2DBackpropInput"]
    waits = [i for i in nodes[grad + "Conv2DBackpropFilter"].input if i.startswith("^")]
    assert waits == ["^" + plan.moved[0].after]
    monkeypatch.setattr(LateGradientsPass, "enabled", lambda self, options: False)
    without = _rewrite(src, tmp_path / "without.meta", "none", batch=32)
    assert result.after.peak_bytes < 0.95 * without.after.peak_bytes
    trained_alike(src, tmp_path / "out.meta", 32)
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    r = verify(str(src), str(tmp_path / "out.meta"), RunSpec(batch_size=32, grappler=True),
               3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches
