"""The fusion guard (passes/fusion_guard.py): a rewritten graph trains the same with
Grappler on, after TF has merged each convolution's filter and bias gradients into one
kernel. Before the guard, tf-slim's AlexNet v2 and ResNet-50 v2 rewrites trained
bit for bit with Grappler off and stopped updating most variables with it on (a cycle
through the merged ops, which TF's executor skips without a word)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphmem.analysis.kernel_fusions import fused_pairs
from graphmem.formats import load_model
from graphmem.graph.names import is_copy
from graphmem.graph.workspace import Workspace
from graphmem.passes.fusion_guard import _edges_between
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

BATCH = 8


def biased_convnet(path: Path, channels=(16, 32, 32, 64), side: int = 32,
                   unfused_bn: bool = False) -> Path:
    """Convolutions with biases and ReLU (AlexNet's layers, small), max pooling, a dense
    head with a bias, Momentum with a global step, saved as a .meta with its shapes. With
    `unfused_bn`, each convolution's bias is a batch norm built from `tf.nn.moments` (as
    Keras builds it where it cannot fuse)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, side, side, 3], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        h, c_in = x, 3
        for i, c in enumerate(channels):
            w = v1.get_variable(f"conv{i}/w", [3, 3, c_in, c], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=i + 1))
            b = v1.get_variable(f"conv{i}/b", [c], use_resource=True,
                                initializer=v1.constant_initializer(0.01))
            h = tf.nn.conv2d(h, w, 1, "SAME")
            if unfused_bn:
                gamma = v1.get_variable(f"bn{i}/gamma", [c], use_resource=True,
                                        initializer=v1.ones_initializer())
                mean, var = tf.nn.moments(h, [0, 1, 2], name=f"moments{i}")
                h = tf.nn.relu(tf.nn.batch_normalization(h, mean, var, b, gamma, 1e-3))
            else:
                h = tf.nn.relu(tf.nn.bias_add(h, b))
            if i % 2 == 1:
                h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            c_in = c
        h = tf.reshape(h, [-1, (side // 4) ** 2 * c_in])
        w = v1.get_variable("fc/w", [(side // 4) ** 2 * c_in, 10], use_resource=True,
                            initializer=v1.glorot_uniform_initializer(seed=9))
        b = v1.get_variable("fc/b", [10], use_resource=True,
                            initializer=v1.zeros_initializer())
        logits = tf.nn.bias_add(tf.matmul(h, w), b)
        loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
        step = v1.train.get_or_create_global_step()
        train = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    return path


@pytest.fixture(scope="module")
def convnet(tmp_path_factory) -> Path:
    return biased_convnet(tmp_path_factory.mktemp("fusion") / "convnet.meta")


@pytest.mark.parametrize("policy", ["memory", "speed"])
def test_rewrite_trains_the_same_with_grappler_on(convnet, tmp_path, policy):
    """With Grappler and oneDNN's merges on, as users train: every variable, the global
    step included, ends where the original's does (float rounding apart: Grappler may
    merge differently in the two graphs)."""
    out = tmp_path / "out.meta"
    options = RewriteOptions(policy, [], BATCH)
    options.keep_worse = True  # the edges are what is tested, whatever the estimate says
    result = rewrite_file(convnet, out, options)
    assert result.plan.copied_ops > 0
    r = verify(str(convnet), str(out), RunSpec(batch_size=BATCH, grappler=True), 3,
               1e-4, 1e-5)
    assert r.same_training, r.mismatches
    # a skipped update leaves its variable (and the step count) unchanged: not "close"
    assert r.max_variable_diff < 1e-3


def test_no_pair_of_merged_ops_is_joined_by_our_edges(convnet, tmp_path):
    """On the rewritten graph, no pair of ops TF may merge has a path between them through
    a control edge a pass added (what the guard removes)."""
    out = tmp_path / "out.meta"
    rewrite_file(convnet, out, RewriteOptions("memory", [], BATCH))
    original = Workspace.open(load_model(str(convnet))).index
    ws = Workspace.open(load_model(str(out)))
    ix = ws.index
    from graphmem.analysis.regions import analyze_regions

    regions = analyze_regions(original, None, BATCH)
    pairs = fused_pairs(ix)
    assert any(ix.ops[b] == "BiasAddGrad" for _, b in pairs)  # the graph has such pairs
    for x, y in pairs:
        a, b = (x, y) if ix.position[x] < ix.position[y] else (y, x)
        assert _edges_between(ix, a, b, original, regions, set()) == set(), \
            (ix.names[a], ix.names[b])


def test_copies_wait_for_the_weight_gradient_beside_their_trigger(convnet, tmp_path,
                                                                  monkeypatch):
    """TF1's gradient tuple groups a layer's input gradient with its weight gradient: a
    segment held back by the input gradient is held back by the weight gradient too (the
    last reader of the layer's input and incoming gradient, which would otherwise stay
    alive through the recomputation), never by a bias gradient (TF merges it with the
    filter gradient, which may read the copies)."""
    out = tmp_path / "out.meta"
    # the pooled tensors kept: the convolution after each reads a checkpoint, not a copy;
    # each segment held back by its own readers' inputs (the gradient entering it)
    import graphmem.rewrite as rw

    choose = rw.choose_checkpoints

    def own_triggers(*args, **kwargs):
        choice = choose(*args, **kwargs)
        choice.lead = False
        return choice

    monkeypatch.setattr(rw, "choose_checkpoints", own_triggers)
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    result = rewrite_file(convnet, out, options)
    ix = Workspace.open(load_model(str(out))).index
    checked = 0
    for segment in result.plan.segments:
        ops = {t: ix.ops[ix.id_of[t]] for t in segment.triggers}
        assert "BiasAddGrad" not in ops.values(), segment.triggers
        for t, op in ops.items():
            if op != "Conv2DBackpropInput":
                continue
            weights = f"{t.rsplit('/', 1)[0]}/Conv2DBackpropFilter"
            if weights in ops:
                checked += 1
            else:  # only where the weight gradient reads copies: it runs after them
                inputs = ix.node(ix.id_of[weights]).input
                assert any(is_copy(i) for i in inputs), segment.triggers
    assert checked
