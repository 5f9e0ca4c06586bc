"""The IdentityN ops Grappler bypasses (analysis/identity_bypass.py), and the estimate that
simulates the step without them.

Keras optimizers pass every gradient through one IdentityN before the updates. On the graph
as written no update could start before the last gradient; Grappler's dependency optimizer
removes the IdentityN first, so TF updates each weight as its gradient arrives (traced on
Keras VGG16: the estimate with the barrier was 137 MiB, the step measured 66 MiB)."""

from __future__ import annotations

import os

import pytest

from graphmem.analysis.identity_bypass import bypassed_identityn
from graphmem.graph.identityn import split_identityn
from tests.graphbuilder import G

C = (256,)


def _joined(reader_of_both: bool = False, control: bool = False, first: str = "Relu",
            device: str = "", retval: bool = False) -> G:
    """Two values `a`, `b` joined by an IdentityN, each output read by its own op (or both
    by one), the IdentityN optionally held by a control input."""
    g = G()
    g.op("x", "Placeholder", shape=C)
    g.op("a", first, "x", shape=C)
    g.op("b", "Relu", "x", shape=C)
    g.op("y", "Placeholder", shape=C)
    g.op("first", "Relu", "y", shape=C)  # nothing the IdentityN reads depends on it
    joined = g.op("ids", "IdentityN", "a", "b", shape=C, n_out=2, device=device)
    if control:
        joined.input.append("^first")
    if reader_of_both:
        g.op("both", "AddV2", "ids", "ids:1", shape=C)
    else:
        g.op("ra", "Neg", "ids", shape=C)
        g.op("rb", "Neg", "ids:1", shape=C)
    if retval:
        g.op("out", "_Retval", "ids:1", shape=C)
    return g


def _bypassed(g: G) -> bool:
    index = g.index()
    return [index.names[i] for i in bypassed_identityn(index, set(range(len(index))))] == \
        ["ids"]


def test_an_identityn_whose_readers_each_read_one_output_is_bypassed():
    assert _bypassed(_joined())


def test_a_control_input_its_inputs_already_wait_for_keeps_nothing():
    g = _joined()
    ids = next(n for n in g.graph_def.node if n.name == "ids")
    ids.input.append("^x")
    assert _bypassed(g)


@pytest.mark.parametrize("case", [
    {"control": True},  # bypassing would give every reader the control input: more edges
    {"reader_of_both": True},  # one reader of two outputs: two edges for one
    {"first": "VarHandleOp"},  # Grappler keeps an Identity of a variable
    {"retval": True},  # a function result reads it
    {"device": "/device:GPU:0"},  # across a device boundary
])
def test_grappler_keeps_the_identityn(case):
    assert not _bypassed(_joined(**case))


def test_split_points_each_reader_at_an_identity_of_its_own_input():
    g = _joined()
    index = g.index()
    assert split_identityn(g.graph_def, index, [index.id_of["ids"]]) == 2
    split = g.index()
    ra, rb = split.id_of["ra"], split.id_of["rb"]
    assert [split.names[s] for s, _ in split.data_inputs[ra]] == ["ids/graphmem_split_0"]
    assert [split.names[s] for s, _ in split.data_inputs[rb]] == ["ids/graphmem_split_1"]
    assert [split.names[s] for s, _ in split.data_inputs[split.id_of["ids/graphmem_split_1"]]] \
        == ["b"]
    assert not split.data_consumers(split.id_of["ids"])


# ---- against TensorFlow: Grappler's own graph, and the estimate ----------------------


def _tf1_joined(path, variant: str):
    """A TF1 step: two dense layers, their gradients joined by an IdentityN before plain
    updates (as Keras' optimizers join them), in one of the variants above."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    v1 = tf.compat.v1
    g = tf.Graph()
    with g.as_default():
        x = v1.placeholder(tf.float32, [64, 512], name="x")
        w0 = v1.get_variable("w0", [512, 512], use_resource=True)
        w1 = v1.get_variable("w1", [512, 512], use_resource=True)
        h = tf.nn.relu(tf.matmul(x, w0))
        loss = tf.reduce_sum(tf.matmul(h, w1))
        g0, g1 = tf.gradients(loss, [w0, w1])
        first = [w0.handle] if variant == "variable" else []
        # an op the gradients do not depend on, whose value is used (Grappler drops a
        # control input the gradients wait for anyway, and turns an unread op into a NoOp)
        top = tf.reduce_max(x)
        seen = v1.get_variable("seen", [], use_resource=True)
        holds = [top.op] if variant == "control" else []
        with tf.control_dependencies(holds):
            joined = tf.raw_ops.IdentityN(input=[*first, g0, g1], name="joined")
        g0, g1 = joined[-2:]
        if variant == "reader_of_both":
            g1 = g1 + g0
        train = tf.group(w0.assign_sub(0.1 * g0), w1.assign_sub(0.1 * g1), seen.assign(top),
                         name="train")
        v1.add_to_collection("train_op", train)
        v1.train.export_meta_graph(str(path), graph_def=g.as_graph_def(add_shapes=True))
    return path


VARIANTS = ["plain", "control", "reader_of_both", "variable"]


@pytest.mark.tf
@pytest.mark.parametrize("variant", VARIANTS)
def test_the_rule_is_grappler_s(variant, tmp_path):
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.runtime.grappler import grappler_graph

    model = load_model(_tf1_joined(tmp_path / f"{variant}.meta", variant))
    ws = Workspace.open(model)
    ours = [ws.index.names[i] for i in bypassed_identityn(ws.index, set(range(len(ws.index))))]
    optimized = grappler_graph(model.meta_graph, ws.graph_def, ["train"])
    removed = "joined" not in {n.name for n in optimized.node}
    assert removed == (variant in ("plain", "variable"))
    if variant == "variable":
        # the dependency optimizer's code keeps an IdentityN of a variable; here it went
        # anyway (its variable output is read by nothing). The rule keeps the barrier:
        # the estimate can be high there, never low
        assert ours == []
    else:
        assert (ours == ["joined"]) == removed


@pytest.mark.tf
def test_the_estimate_runs_the_step_without_the_barrier_grappler_removes(tmp_path):
    from graphmem.analysis.regions import analyze_regions
    from graphmem.analysis.step_estimate import estimate_step
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    def estimate(path, split=False):
        ws = Workspace.open(load_model(path))
        if split:
            split_identityn(ws.graph_def, ws.index, [ws.index.id_of["joined"]])
            ws.reindex()
        return estimate_step(ws, analyze_regions(ws.index, None, 64), 64)

    plain = estimate(_tf1_joined(tmp_path / "plain.meta", "plain"))
    held = estimate(_tf1_joined(tmp_path / "control.meta", "control"))
    by_hand = estimate(tmp_path / "plain.meta", split=True)
    # without the barrier, w1's update runs before w0's gradient exists: one 1 MiB weight
    # gradient fewer at the peak
    assert plain.estimated_bytes == by_hand.estimated_bytes
    assert plain.estimated_bytes < held.estimated_bytes


@pytest.mark.tf
def test_the_floor_leaves_out_an_identityn_grappler_bypasses(tmp_path):
    """Its inputs never need to live together: TF never runs it. One that Grappler keeps
    (a control input) joins both 1 MiB weight gradients, the largest footprint here."""
    from graphmem.analysis.floor import step_floor
    from graphmem.analysis.regions import analyze_regions
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    def floor(variant):
        ws = Workspace.open(load_model(_tf1_joined(tmp_path / f"{variant}.meta", variant)))
        return step_floor(ws.index, analyze_regions(ws.index, None, 64), 64)

    kept, bypassed = floor("control"), floor("plain")
    assert kept.op == "joined" and kept.bytes >= 2 * 2**20
    assert bypassed.op != "joined" and bypassed.bytes < kept.bytes
