"""Recompute inside control-flow-v2 loop bodies (`passes/loop_recompute.py`).

Every rewrite here is trained side by side with its original under `verify --exact` (zero
tolerance, Grappler off) at one and two inter-op threads; the structure is checked on the
rewritten functions themselves (what each forward push now receives, what the gradient
body copies), and loops with what the pass must not copy (dropout, `If`, a nested loop)
must train the same with those values still accumulated.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphmem.formats import load_model
from graphmem.graph.names import is_copy
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify
from tests.conftest import fixture_path, run_cli

pytestmark = pytest.mark.tf

SCOPE = "graphmem_loop_recompute/"


def _same_training(src: Path, out: Path, batch: int, threads: int = 1, steps: int = 3):
    result = verify(str(src), str(out), RunSpec(batch_size=batch, grappler=False,
                                                inter_op_threads=threads), steps, 0.0, 0.0)
    assert result.same_training, result.mismatches
    assert result.variables_compared > 0
    return result


def _functions(path: Path) -> dict:
    return {f.signature.name: f for f in load_model(path).graph_def.library.function}


def _pushed(fn) -> dict[str, str]:
    """Push node name -> the tensor it pushes (function input syntax)."""
    return {n.name: n.input[1] for n in fn.node_def if n.op == "TensorListPushBack"}


def _forward_body(fns: dict, hint: str = "") -> str:
    names = [n for n, f in fns.items() if any(x.op == "TensorListPushBack" for x in f.node_def)
             and hint in n]
    assert names, "no forward body with pushes"
    return names[0]


# ---- the LSTM fixture (TF1 graph, control flow v2) ---------------------------------------
@pytest.fixture(scope="module")
def lstm_rewrites(tmp_path_factory):
    out = tmp_path_factory.mktemp("lstm_bodies")
    src = fixture_path("lstm_v2")
    results = {}
    for policy in ("memory", "speed"):
        dst = out / f"{policy}.meta"
        results[policy] = (dst, rewrite_file(src, dst, RewriteOptions(policy, [], 64)))
    off = out / "off.meta"
    results["off"] = (off, rewrite_file(src, off, RewriteOptions("memory", [], 64,
                                                                 loop_recompute=False)))
    return src, results


def test_lstm_gates_are_no_longer_accumulated(lstm_rewrites):
    src, results = lstm_rewrites
    dst, result = results["memory"]
    assert not result.reverted
    (fact,) = result.loops.loops
    assert fact.loop == "rnn/while"
    rebuilt = {name.split(":")[0] for name in fact.rebuilt}
    # the gates, the cell's output and the matmul input are rebuilt ...
    assert {"Sigmoid", "Sigmoid_1", "Sigmoid_2", "Tanh", "Tanh_1", "concat"} <= rebuilt
    # ... from the loop-carried state and the step's input, which stay accumulated
    for kept in ("placeholder_2:0", "placeholder_3:0", "TensorArrayV2Read/TensorListGetItem:0"):
        assert kept in fact.kept
    assert fact.bytes_saved_per_iteration and fact.bytes_saved_per_iteration > 0
    # in the written file: no push receives a rebuilt value any more
    before, after = _functions(src), _functions(dst)
    body = _forward_body(after)
    old = set(_pushed(before[body]).values())
    new = set(_pushed(after[body]).values())
    assert all(not v.startswith(tuple(f"{r}:" for r in rebuilt)) for v in new)
    assert any(v.startswith("Sigmoid:") for v in old)
    grad = [n for n, f in after.items() if any(x.name.startswith(SCOPE) for x in f.node_def)
            and n != body]
    assert len(grad) == 1
    copies = [x for x in after[grad[0]].node_def if x.name.startswith(SCOPE)]
    assert any(x.op == "MatMul" for x in copies)
    # no copy of a variable read, a list op or a random op
    assert not any(x.op in ("ReadVariableOp", "TensorListGetItem") for x in copies)
    # the estimate sees the lists shrink
    off = results["off"][1]
    assert result.after.peak_bytes < off.after.peak_bytes


def test_speed_policy_keeps_the_matmul_output(lstm_rewrites):
    _, results = lstm_rewrites
    (fact,) = results["speed"][1].loops.loops
    assert "MatMul:0" in fact.now_accumulated  # a freed list now holds it
    assert "MatMul:0" not in fact.rebuilt
    memory_saved = results["memory"][1].loops.loops[0].bytes_saved_per_iteration
    assert 0 < fact.bytes_saved_per_iteration < memory_saved


def test_no_loop_bodies_leaves_the_functions_alone(lstm_rewrites):
    src, results = lstm_rewrites
    dst, result = results["off"]
    assert result.loops is None
    before, after = _functions(src), _functions(dst)
    assert all(before[n].SerializeToString(deterministic=True)
               == after[n].SerializeToString(deterministic=True) for n in before)


@pytest.mark.parametrize("policy", ["memory", "speed"])
@pytest.mark.parametrize("threads", [1, 2])
def test_lstm_rewrites_train_identically(lstm_rewrites, policy, threads):
    src, results = lstm_rewrites
    _same_training(src, results[policy][0], 64, threads, steps=4)


def test_cli_reports_the_loop_in_json(tmp_path):
    out = tmp_path / "o.meta"
    res = run_cli("rewrite", fixture_path("lstm_v2"), "-o", out, "--batch-size", "64",
                  "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    loops = doc["loop_bodies"]
    assert loops["policy"] == "memory"
    (lp,) = loops["loops"]
    assert lp["loop"] == "rnn/while" and lp["bytes_saved_per_iteration"] > 0
    assert "Sigmoid:0" in lp["rebuilt"]
    res = run_cli("rewrite", fixture_path("lstm_v2"), "-o", tmp_path / "p.meta",
                  "--batch-size", "64", "--no-loop-bodies", "--json")
    assert json.loads(res.stdout)["loop_bodies"] is None


# ---- loops with values that must stay accumulated ----------------------------------------
def _build_tf1_loop(path: Path, variant: str) -> None:
    """A TF1 graph, control flow v2: h = tanh(z) * sigmoid(z), z = [x_t, h] @ W + b, over
    5 steps (64 units), with
    `variant` inside the body: "dropout" (a seeded random mask), "cond" (an If on the
    step), "nested" (an inner while loop), or "plain"."""
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.enable_control_flow_v2()
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(7)
        x = v1.placeholder(tf.float32, [None, 5, 8], name="x")
        y = v1.placeholder(tf.float32, [None, 1], name="y")
        w = v1.get_variable("w", [72, 64], initializer=v1.glorot_uniform_initializer(seed=1),
                            use_resource=True)
        b = v1.get_variable("b", [64], initializer=v1.constant_initializer(0.1),
                            use_resource=True)
        w_out = v1.get_variable("w_out", [64, 1],
                                initializer=v1.glorot_uniform_initializer(seed=2),
                                use_resource=True)
        xs = tf.transpose(x, [1, 0, 2])

        def body(i, h):
            z = tf.matmul(tf.concat([xs[i], h], 1), w) + b
            if variant == "dropout":
                z = tf.nn.dropout(z, rate=0.3, seed=3)
            elif variant == "cond":
                z = tf.cond(i % 2 < 1, lambda: tf.sigmoid(z) * z, lambda: z * 0.5)
            elif variant == "nested":
                _, z = tf.while_loop(lambda k, a: k < 2, lambda k, a: (k + 1, tf.sin(a) * a),
                                     [tf.constant(0), z])
            return i + 1, tf.tanh(z) * tf.sigmoid(z)

        _, h = tf.while_loop(lambda i, h: i < 5, body,
                             [tf.constant(0), tf.zeros(tf.stack([tf.shape(x)[0], 64]))])
        loss = v1.losses.mean_squared_error(y, tf.matmul(h, w_out))
        train_op = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        assert train_op in v1.get_collection("train_op")
        v1.variables_initializer(v1.global_variables(), name="init")
        saver = v1.train.Saver()
        v1.train.export_meta_graph(filename=str(path), graph_def=graph.as_graph_def(
            add_shapes=True), saver_def=saver.as_saver_def())


@pytest.fixture(scope="module")
def tf1_loops(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf1_loops")
    paths = {}
    for variant in ("plain", "dropout", "cond", "nested"):
        paths[variant] = out / f"{variant}.meta"
        _build_tf1_loop(paths[variant], variant)
    return paths


@pytest.mark.parametrize("variant", ["plain", "dropout", "cond", "nested"])
def test_loops_with_unsafe_ops_train_identically(tf1_loops, variant, tmp_path):
    src = tf1_loops[variant]
    out = tmp_path / "out.meta"
    result = rewrite_file(src, out, RewriteOptions("memory", [], 16, keep_worse=True))
    facts = {lp.loop: lp for lp in result.loops.loops}
    fns = _functions(out)
    copied_ops = {x.op for f in fns.values() for x in f.node_def if x.name.startswith(SCOPE)}
    # nothing stateful, no control flow is ever copied into a gradient body
    assert not copied_ops & {"RandomUniform", "If", "StatelessIf", "While", "StatelessWhile",
                             "ReadVariableOp"}
    outer = facts.get("while")
    if variant == "plain":
        assert outer is not None and outer.rebuilt
    if variant == "dropout" and outer is not None:
        # the random values are kept (or held by a freed list), never rebuilt
        assert not any("random" in n.lower() for n in outer.rebuilt)
        assert any("random" in n.lower() for n in list(outer.kept) + outer.now_accumulated)
    if variant in ("cond", "nested") and outer is not None:
        assert any("control flow" in why for why in outer.kept.values()) or \
            any(n.startswith(("cond", "while")) for n in outer.now_accumulated)
    for threads in (1, 2):
        _same_training(src, out, 16, threads)


# ---- TF2 train steps -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def keras_lstm2(tmp_path_factory):
    from benchmarks.loop_recompute_bench import build_keras_lstm2

    path = tmp_path_factory.mktemp("keras_lstm") / "saved"
    build_keras_lstm2(path, steps=8, width=16)
    return path


@pytest.mark.parametrize("policy", ["memory", "speed"])
def test_keras_stacked_lstms_train_identically(keras_lstm2, policy, tmp_path):
    out = tmp_path / "out"
    result = rewrite_file(keras_lstm2, out, RewriteOptions(policy, [], 16, keep_worse=True))
    for lp in result.loops.loops:
        assert lp.rebuilt and lp.bytes_saved_per_iteration > 0
    if policy == "memory":
        assert len(result.loops.loops) == 2  # both LSTM layers
        assert result.after.peak_bytes < result.before.peak_bytes
    else:
        # Keras cells multiply x and h apart: keeping both matmul outputs costs more than
        # the gates it would save, so the speed policy leaves the loops whole
        assert all("nothing to rebuild" in why for name, why in result.loops.skipped.items()
                   if "_grad" not in name)
    for threads in (1, 2):
        _same_training(keras_lstm2, out, 16, threads, steps=2)


def test_loop_bodies_with_replayed_loops(keras_lstm2, tmp_path):
    # --recompute-loops replays a whole forward loop: its body then has two users, and the
    # loop-body pass must leave that loop alone rather than edit a shared function
    out = tmp_path / "out"
    result = rewrite_file(keras_lstm2, out, RewriteOptions("memory", [], 16, keep_worse=True,
                                                           recompute_loops=True))
    fns = load_model(out).function
    replayed = [n.name for n in fns.node_def if n.op in ("While", "StatelessWhile")
                and is_copy(n.name)]
    assert replayed, "the policy replayed no loop: the test checks nothing"
    shared = [name for name, why in result.loops.skipped.items() if "more than one op" in why]
    assert shared  # the replayed loop's body has two users: left whole
    _same_training(keras_lstm2, out, 16, 1, steps=2)


def test_reverted_rewrite_restores_loop_functions(keras_lstm2, tmp_path, monkeypatch):
    # a TF2 train step's workspace graph is one function: undoing a rewrite must also undo
    # the edits of the loop bodies elsewhere in the library
    import graphmem.rewrite as rw

    real = rw._estimate
    calls = {"n": 0}

    def worse(ws, regions, options):
        est = real(ws, regions, options)
        calls["n"] += 1
        if calls["n"] > 1:  # every estimate after the passes: pretend it is worse
            est.peak_bytes = 10 ** 12
        return est

    monkeypatch.setattr(rw, "_estimate", worse)
    monkeypatch.setattr(rw, "Background", _Inline)
    out = tmp_path / "out"
    result = rewrite_file(keras_lstm2, out, RewriteOptions("memory", [], 16))
    assert result.reverted
    before, after = _functions(keras_lstm2), _functions(out)
    assert all(before[n].SerializeToString(deterministic=True)
               == after[n].SerializeToString(deterministic=True) for n in before)


class _Inline:
    """Background stand-in that computes in this process (so the patched estimate runs)."""

    def __init__(self, fn, size, force=None):
        self._value = fn()

    def result(self):
        return self._value


def test_loop_body_policy_follows_the_rewrite_policy():
    assert RewriteOptions("memory").loop_body_policy() == "memory"
    assert RewriteOptions("budget").loop_body_policy() == "memory"
    assert RewriteOptions("speed").loop_body_policy() == "speed"
    assert RewriteOptions("none").loop_body_policy() is None
    assert RewriteOptions("none", loop_recompute=True).loop_body_policy() == "memory"
    assert RewriteOptions("memory", loop_recompute=False).loop_body_policy() is None
