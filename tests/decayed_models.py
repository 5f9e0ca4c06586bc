"""TF1 classifiers with L2 weight decay as tf-slim adds it (REGULARIZATION_LOSSES,
get_total_loss) and Momentum: the weight-decay tests' models."""

from __future__ import annotations

import os
from pathlib import Path


def decayed_classifier(path: Path, widths: list[int], decay_last: bool = True) -> Path:
    """Dense layers `widths[0] -> widths[1] -> ... -> widths[-1]` (ReLU between them, weights
    `w0`, `w1`, ...), each weight decayed (the last one only with `decay_last`), saved as a
    .meta with its shapes."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [None, widths[0]], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        h = x
        last = len(widths) - 2
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            w = v1.get_variable(f"w{i}", [a, b], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=i + 1))
            if i < last or decay_last:
                v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES,
                                     4e-5 * tf.nn.l2_loss(w))
            h = tf.matmul(h, w)
            if i < last:
                h = tf.nn.relu(h)
        v1.losses.sparse_softmax_cross_entropy(y, h)
        loss = v1.losses.get_total_loss()
        train = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    return path


def trained_alike(original: Path, rewritten: Path, batch: int, threads=(1, 2)) -> list:
    """Train both graphs 3 steps at each inter-op thread setting, Grappler off, and demand
    bit-identical losses and variables; returns the verify results."""
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    results = []
    for t in threads:
        r = verify(str(original), str(rewritten),
                   RunSpec(batch_size=batch, grappler=False, inter_op_threads=t), 3, 0.0, 0.0)
        assert r.same_training and r.max_variable_diff == 0, r.mismatches
        results.append(r)
    return results


def decayed_conv_head(path: Path, batch: int, side: int = 32, channels: int = 64,
                      units: int = 1024) -> Path:
    """A 3x3 convolution with ReLU and 2x2 max pooling, then a fully connected layer as a
    VALID convolution over the whole pooled map (tf-slim's AlexNet and OverFeat fc6: a
    filter of (side/2)^2 x channels x units), then a 1x1 head; every weight decayed,
    Momentum, `minimize` with tf.gradients' default gate (GATE_OP) and a global step.
    Saved as a .meta."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [batch, side, side, 3], name="x")
        y = v1.placeholder(tf.int32, [batch], name="y")

        def weight(name, shape, seed):
            w = v1.get_variable(name, shape, use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=seed))
            v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES, 4e-5 * tf.nn.l2_loss(w))
            return w

        h = tf.nn.relu(tf.nn.conv2d(x, weight("conv", [3, 3, 3, channels], 1), 1, "SAME"))
        h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        half = side // 2
        h = tf.nn.relu(tf.nn.conv2d(h, weight("fc", [half, half, channels, units], 2), 1,
                                    "VALID"))
        logits = tf.reshape(tf.nn.conv2d(h, weight("head", [1, 1, units, 10], 3), 1,
                                         "VALID"), [batch, 10])
        v1.losses.sparse_softmax_cross_entropy(y, logits)
        loss = v1.losses.get_total_loss()
        # with a global step, as tf-slim's train scripts: its increment waits for every
        # update, and is no part of any one gradient's update
        step = v1.train.get_or_create_global_step()
        train = v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=step)
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    return path
