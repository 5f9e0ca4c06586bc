"""Statistics kept, not recomputed (recompute.py, _small_reductions): an unfused batch
norm's mean and variance (per channel), and what is computed from them alone (the scale and
offset), stay alive to the backward pass; the copies start after them. Recomputing them ran
a memory-bound mean, a full-size squared difference and a second mean per layer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from graphmem.formats import load_model
from graphmem.graph.names import COPY_SCOPE
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

pytestmark = pytest.mark.tf

BATCH = 8
SIDE = 32


def unfused_bn_convnet(path: Path, channels=(16, 16, 32, 32)) -> Path:
    """Convolutions, batch norm built from `tf.nn.moments` (as Keras builds it where it
    cannot fuse), ReLU, pooling, a dense head; Momentum; saved as a .meta with shapes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, SIDE, SIDE, 3], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        h, c_in = x, 3
        for i, c in enumerate(channels):
            w = v1.get_variable(f"conv{i}/w", [3, 3, c_in, c], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=i + 1))
            gamma = v1.get_variable(f"bn{i}/gamma", [c], use_resource=True,
                                    initializer=v1.ones_initializer())
            beta = v1.get_variable(f"bn{i}/beta", [c], use_resource=True,
                                   initializer=v1.zeros_initializer())
            h = tf.nn.conv2d(h, w, 1, "SAME")
            mean, var = tf.nn.moments(h, [0, 1, 2], name=f"moments{i}")
            h = tf.nn.relu(tf.nn.batch_normalization(h, mean, var, beta, gamma, 1e-3))
            if i % 2 == 1:
                h = tf.nn.max_pool2d(h, 2, 2, "VALID")
            c_in = c
        h = tf.reshape(h, [-1, (SIDE // 4) ** 2 * c_in])
        w = v1.get_variable("fc/w", [(SIDE // 4) ** 2 * c_in, 10], use_resource=True,
                            initializer=v1.glorot_uniform_initializer(seed=9))
        logits = tf.matmul(h, w)
        loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
        train = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    return path


@pytest.fixture(scope="module")
def bn_net(tmp_path_factory) -> Path:
    return unfused_bn_convnet(tmp_path_factory.mktemp("bn") / "bn.meta")


def _copied_ops(path: Path) -> list[str]:
    ix = Workspace.open(load_model(str(path))).index
    return [ix.ops[i] for i, name in enumerate(ix.names)
            if name.startswith(COPY_SCOPE + "/")]


def test_statistics_are_kept_and_training_is_the_same(bn_net, tmp_path):
    out = tmp_path / "out.meta"
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    result = rewrite_file(bn_net, out, options)
    copied = _copied_ops(out)
    assert "Conv2D" in copied  # the segments are recomputed ...
    # ... from kept statistics: no mean, no squared difference, no reciprocal root
    assert not {"Mean", "SquaredDifference", "Rsqrt"} & set(copied), copied
    assert result.plan.cycle_breaks == 0
    # the saved means, variances and scales of the four layers, at least
    assert result.plan.kept_statistics >= 8
    from graphmem.report.rewrite_report import rewrite_document

    assert rewrite_document(result, str(out))["kept_statistics"] == result.plan.kept_statistics
    r = verify(str(bn_net), str(out), RunSpec(batch_size=BATCH, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches


def test_without_the_rule_the_statistics_were_recomputed(bn_net, tmp_path, monkeypatch):
    """The contrast that makes the first test mean something: the same plan, the rule off."""
    import graphmem.passes.recompute as rc

    monkeypatch.setattr(rc, "_small_reductions", lambda *a: set())
    out = tmp_path / "out.meta"
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    rewrite_file(bn_net, out, options)
    copied = _copied_ops(out)
    assert {"Mean", "SquaredDifference"} <= set(copied), copied
