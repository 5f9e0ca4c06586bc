"""A U-Net with long skip connections: few bottlenecks, so the memory policy falls back to
cuts; every rewrite must still train exactly as the original."""

import os

import pytest

from graphmem.passes.swap import SwapOptions
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify


def _build_unet(path):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        v1.set_random_seed(3)
        x = v1.placeholder(tf.float32, [None, 32, 32, 3], name="x")
        y = v1.placeholder(tf.float32, [None, 32, 32, 1], name="y")
        seed = iter(range(100, 1000))

        def conv(h, c_out, name):
            c_in = h.shape[-1]
            w = v1.get_variable(name, [3, 3, c_in, c_out], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=next(seed)))
            return tf.nn.relu(tf.nn.conv2d(h, w, 1, "SAME"))

        skips, h = [], x
        for depth, ch in enumerate([8, 16, 32]):
            h = conv(conv(h, ch, f"down{depth}a"), ch, f"down{depth}b")
            skips.append(h)
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = conv(h, 64, "bottom")
        for depth, ch in reversed(list(enumerate([8, 16, 32]))):
            size = h.shape[1] * 2
            h = tf.image.resize(h, [size, size], method="nearest")
            h = tf.concat([h, skips[depth]], axis=-1)  # the long skip
            h = conv(conv(h, ch, f"up{depth}a"), ch, f"up{depth}b")
        w = v1.get_variable("head", [1, 1, 8, 1], use_resource=True,
                            initializer=v1.glorot_uniform_initializer(seed=7))
        out = tf.nn.conv2d(h, w, 1, "SAME")
        loss = tf.reduce_mean(tf.square(out - y))
        train = v1.train.AdamOptimizer(1e-3).minimize(loss)
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))


@pytest.fixture(scope="module")
def unet(tmp_path_factory):
    path = tmp_path_factory.mktemp("unet") / "unet.meta"
    _build_unet(path)
    return path


@pytest.mark.parametrize("policy,swap", [("memory", False), ("speed", False), ("none", True),
                                         ("memory", True)])
def test_unet_rewrites_train_identically(unet, tmp_path, policy, swap):
    out = tmp_path / "out.meta"
    result = rewrite_file(unet, out, RewriteOptions(
        policy, [], 16, swap=SwapOptions() if swap else None, keep_worse=True))
    if policy == "memory":
        assert result.plan.copied_ops > 0
    r = verify(str(unet), str(out), RunSpec(batch_size=4, grappler=False), 3, 0.0, 0.0)
    assert r.same_training, r.mismatches


def test_unet_memory_policy_lowers_the_estimate(unet, tmp_path):
    result = rewrite_file(unet, tmp_path / "o.meta", RewriteOptions("memory", [], 16))
    assert not result.reverted
    assert result.after.peak_bytes < result.before.peak_bytes
