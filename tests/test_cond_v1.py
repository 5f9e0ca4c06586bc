"""`tf.cond` in the forward pass with control flow v1 (Switch/Merge): ops in a branch produce
dead tensors when their branch is not taken, and TF passes deadness along control edges.
Recompute and swap triggers, and early-update edges, taken from the gradient cond's branch
made whole parts of the backward pass and the optimizer dead in those steps: every rewrite
trained differently (Adam's beta powers were not even updated). Found by
benchmarks/model_sweep.py."""

import os

import pytest

from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.swap import SwapOptions
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify


@pytest.fixture(scope="module")
def cond_v1(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    path = tmp_path_factory.mktemp("cond") / "cond_v1.meta"
    v1.disable_control_flow_v2()
    try:
        g = tf.Graph()
        with g.as_default():
            x = v1.placeholder(tf.float32, [None, 32], name="x")
            y = v1.placeholder(tf.int32, [None], name="y")
            seeds = iter(range(1, 100))

            def var(name, shape):
                return v1.get_variable(name, shape, use_resource=True,
                                       initializer=v1.glorot_uniform_initializer(next(seeds)))

            h = x
            for i in range(3):
                h = tf.nn.relu(tf.matmul(h, var(f"pre{i}", [32, 32])))
            wa, wb = var("a", [32, 32]), var("b", [32, 32])
            h = tf.cond(tf.reduce_mean(x) > 0.0, lambda: tf.nn.relu(tf.matmul(h, wa)),
                        lambda: tf.tanh(tf.matmul(h, wb)))
            for i in range(3):
                h = tf.nn.relu(tf.matmul(h, var(f"post{i}", [32, 32])))
            logits = tf.matmul(h, var("out", [32, 10]))
            loss = v1.losses.sparse_softmax_cross_entropy(y, logits)
            train = v1.train.AdamOptimizer(1e-3).minimize(loss)
            v1.add_to_collection("train_op", train)
            v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    finally:
        v1.enable_control_flow_v2()
    return path


def test_branch_ops_may_be_dead_and_the_merge_is_live(cond_v1):
    index = Workspace.open(load_model(cond_v1)).index
    name = {n: i for i, n in enumerate(index.names)}
    assert index.may_be_dead(name["cond/Relu"]) and index.may_be_dead(name["cond/Tanh"])
    assert not index.may_be_dead(name["cond/Merge"])
    assert not index.may_be_dead(name["Relu_3"])  # after the cond
    assert not index.may_be_dead(name["Relu_2"])  # before it
    grads = [i for i, n in enumerate(index.names) if n.startswith("gradients/cond/")
             and index.ops[i] == "MatMul"]
    assert grads and all(index.may_be_dead(i) for i in grads)


@pytest.mark.parametrize("policy,swap", [("memory", False), ("none", True)])
def test_cond_v1_rewrites_train_identically(cond_v1, tmp_path, policy, swap, monkeypatch):
    import graphmem.rewrite as rw

    # the bottleneck heuristic's plan, which copies ops next to the cond (the memory
    # policy's search finds recompute saves nothing on a graph this small)
    monkeypatch.setattr(rw, "MEMORY_SEARCH_NODES", 0)
    out = tmp_path / "out.meta"
    result = rewrite_file(cond_v1, out, RewriteOptions(
        policy, [], 16, swap=SwapOptions() if swap else None, keep_worse=True))
    assert result.plan.copied_ops > 0 or (result.swap and result.swap.pairs)
    r = verify(str(cond_v1), str(out), RunSpec(batch_size=16, grappler=False), 4, 0.0, 0.0)
    assert r.same_training, r.mismatches[:4]
