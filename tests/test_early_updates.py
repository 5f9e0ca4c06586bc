"""Early updates change the order of a step, never a value."""

import pytest

from benchmarks.synthetic import chain_training_graph
from graphmem.analysis.regions import analyze_regions
from graphmem.formats import load_model
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import is_copy
from graphmem.graph.opdefs import OpRegistry
from graphmem.graph.workspace import Workspace
from graphmem.passes.early_updates import apply_early_updates
from tests.conftest import fixture_path


def test_updates_get_edges_to_the_next_backward_ops():
    ws = Workspace.open(load_model(fixture_path("mlp")))
    ix = ws.index
    regions = analyze_regions(ix)
    before = {n.name: list(n.input) for n in ix.graph_def.node}
    plan = apply_early_updates(ix, regions)
    assert plan.updates >= 48 and plan.edges >= plan.updates  # weights and biases of 24 layers
    # Adam's beta-power updates wait for every gradient: named as such, not as a walk that
    # ran out of budget
    assert plan.skipped.get("waits for several gradients") == 2, plan.skipped
    assert "gradient not found within the search budget" not in plan.skipped
    new = ws.reindex()  # no cycle
    added = {}
    for node in new.graph_def.node:
        extra = [x for x in node.input if x not in before[node.name]]
        if extra:
            added[node.name] = extra
    assert sum(len(v) for v in added.values()) == plan.edges + plan.handle_edges
    backward_names = {ix.names[i] for i in regions.backward}
    forward_names = {ix.names[i] for i in regions.forward}
    handles = 0
    for target, controls in added.items():
        for c in controls:
            assert c.startswith("^")
            if new.ops[new.id_of[c[1:]]] == "VarHandleOp":
                # a slot's handle runs before the forward read of its variable (a root of
                # the step only the update reads could otherwise run last of all)
                assert target in forward_names and new.ops[new.id_of[target]] == \
                    "ReadVariableOp"
                handles += 1
            else:
                assert target in backward_names and "Apply" in new.ops[new.id_of[c[1:]]]
    assert handles == plan.handle_edges >= 2 * 48  # Adam's two slots of 24 x 2 variables
    # the update of layer 20's weights now precedes the relu gradient of layer 19
    assert "^Adam/update_layer_20/weights/ResourceApplyAdam" in added[
        "gradients/layer_19/Relu_grad/ReluGrad"]


def test_update_racing_an_unordered_read_is_left_alone():
    # in this graph the backward dx matmul reads the ref variable without being ordered
    # before the in-place update: moving the update earlier could change what it reads
    g = chain_training_graph(6)
    ix = GraphIndex.build(g, OpRegistry(use_tensorflow=False))
    plan = apply_early_updates(ix, analyze_regions(ix))
    assert plan.edges == 0
    assert plan.skipped == {"a read of the variable is not ordered before or after the update": 6}


def test_edges_that_close_a_cycle_only_together_are_dropped():
    from graphmem.graph.index import closing_cycles as _closing_cycles
    from tests.graphbuilder import G

    # each edge a -> x alone is safe; a1 -> x1 -> g2 -> a2 -> x2 -> g1 -> a1 is a cycle
    g = G()
    g.op("x1", "Relu")
    g.op("x2", "Relu")
    g.op("g1", "Relu", "x2")
    g.op("g2", "Relu", "x1")
    g.op("a1", "Relu", "g1")
    g.op("a2", "Relu", "g2")
    g.op("free", "Relu")
    g.op("a3", "Relu", "free")
    ix = g.index()
    n = ix.id_of
    def edges(chosen):  # update -> its (update, target) edges
        return {a: [(a, x) for x in xs] for a, xs in chosen.items()}

    assert _closing_cycles(ix, edges({n["a1"]: [n["x1"]]})) == []
    assert _closing_cycles(ix, edges({n["a2"]: [n["x2"]]})) == []
    both = {n["a1"]: [n["x1"]], n["a2"]: [n["x2"]], n["a3"]: [n["x1"]]}
    dropped = _closing_cycles(ix, edges(both))
    assert n["a1"] in dropped and n["a2"] in dropped
    # what is left after dropping them is acyclic: a3 -> x1 alone
    rest = {a: xs for a, xs in both.items() if a not in dropped}
    assert _closing_cycles(ix, edges(rest)) == []
    # an edge into an update counts too: x2 -> a1 with a1 -> x1 -> g2 -> a2 -> x2
    into = {n["a1"]: [(n["a1"], n["x1"]), (n["x2"], n["a1"])], n["a2"]: [(n["a2"], n["x2"])]}
    assert n["a1"] in _closing_cycles(ix, into) or n["a2"] in _closing_cycles(ix, into)


def test_slot_products_wait_for_their_gradient(tmp_path):
    """The TF2 fixture's hand-written momentum computes `mu * v` from the slot alone: ready
    at the start of the step, the executor made every layer's product at once when early
    updates stalled the backward chain, and the estimate rose above the original's (the
    driver undid the rewrite). Held back until the gradient, the step is lower and trains
    bit for bit the same."""
    import pytest

    from graphmem.rewrite import RewriteOptions, rewrite_file

    out = tmp_path / "none"
    result = rewrite_file(fixture_path("tf2_saved_model"), out, RewriteOptions("none", [], 32))
    assert result.early.held_back >= 8 and result.early.updates > 0
    assert not result.reverted
    assert result.after.peak_bytes < 0.8 * result.before.peak_bytes
    pytest.importorskip("tensorflow")
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    r = verify(str(fixture_path("tf2_saved_model")), str(out),
               RunSpec(batch_size=32, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches


def _scale_and_offset_graph(side: int):
    """A Keras-style batch norm's two parameter gradients, side x side activations: the
    offset's gradient is `Sum(dy)`; the scale's is `Sum(dy * x)`, whose reduction is where
    the backward chain goes on past the offset's gradient."""
    from tests.graphbuilder import G

    big = (side, side)
    g = G()
    for v in ("beta", "gamma"):
        g.op(v, "VarHandleOp", shape=())
        g.op(f"{v}/read", "ReadVariableOp", v, shape=(side,))
    g.op("x", "Placeholder", shape=big)
    g.op("y", "Mul", "x", "gamma/read", shape=big)
    g.relu_loss("y", big, "gradient_tape")
    g.op("gradient_tape/dbeta", "Sum", "gradient_tape/dy", shape=(side,))
    g.op("gradient_tape/dyx", "Mul", "gradient_tape/dy", "x", shape=big)
    g.op("gradient_tape/dgamma_sum", "Sum", "gradient_tape/dyx", shape=(side,))
    g.op("gradient_tape/dgamma", "Reshape", "gradient_tape/dgamma_sum", shape=(side,))
    for v, grad in (("beta", "gradient_tape/dbeta"), ("gamma", "gradient_tape/dgamma")):
        g.op(f"apply_{v}", "ResourceApplyGradientDescent", v, grad, shape=())
    return g


def test_a_reduction_of_a_large_input_passes_its_wait_on_to_its_readers():
    """Keras MobileNetV2 (issue 21): the offset's update was made to hold back the `Sum` of
    `dy * x`, so a full-size product stayed alive through the update's chain at two
    threads. A reduction frees its input: the edge goes to what reads its result."""
    for side, target in ((64, "gradient_tape/dgamma"), (8, "gradient_tape/dgamma_sum")):
        index = _scale_and_offset_graph(side).index()
        plan = apply_early_updates(index, analyze_regions(index))
        assert plan.updates >= 1, plan
        waiting = [index.names[c] for c in range(len(index))
                   if index.id_of["apply_beta"] in index.control_inputs[c]]
        # 64 x 64 reduced to 64 is a reduction worth letting run; 8 x 8 to 8 is not
        assert waiting == [target], (side, waiting)


@pytest.mark.tf
def test_no_update_waits_on_ops_tf_merges(tmp_path):
    """A dense head recomputed for the backward pass leaves the forward `MatMul` and
    `BiasAdd` unordered with the updates of their variables; an edge from them to the
    updates (to spare a copy of the variable) kept Grappler's remapper from merging them
    into one `_FusedMatMul` as it merges the original's, and the unmerged pair rounds
    otherwise. Updates of resource variables do not wait on such ops."""
    from unittest import mock

    import graphmem.passes.early_updates as early_updates
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from tests.tf2_steps import save_squeeze_excite_step

    src = save_squeeze_excite_step(tmp_path / "se", side=32)
    options = RewriteOptions("names", ["/conv[01][^/]*/convolution:0$",
                                       "/se_reduce[01][^/]*/BiasAdd:0$"], 4, keep_worse=True)

    def head_edges(out):
        index = Workspace.open(load_model(out)).index
        head = [i for i, n in enumerate(index.names)
                if "dense" in n and index.ops[i] in ("MatMul", "BiasAdd")
                and "gradient" not in n and not is_copy(n)]
        assert len(head) == 2
        return [index.names[c] for i in head for c in index.control_consumers[i]]

    rewrite_file(src, tmp_path / "out", options)
    assert head_edges(tmp_path / "out") == []
    with mock.patch.object(early_updates, "in_merged_chain", lambda *args: False):
        rewrite_file(src, tmp_path / "edges", options)
    assert head_edges(tmp_path / "edges")  # the rule is what keeps them off
