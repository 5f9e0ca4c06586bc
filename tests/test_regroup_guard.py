"""The regroup guard (passes/regroup_guard.py): the rewrite's ordering edges stay off the
sums and products Grappler regroups, so the rewritten graph rounds as the original does
with Grappler on, as users run it.

Found on Keras MobileNetV2: an early update's edge from the last batch norm's scale
gradient kept Grappler from regrouping it with the optimizer's `grad * lr`; the momentum
differed in its last bit from the first step and the loss from step 55. The checks trained
with Grappler off (`verify --exact`), where the graph trained bit for bit."""

from __future__ import annotations

import pytest

from graphmem.analysis.arithmetic_groups import ADD, MUL, regrouped_trees
from graphmem.passes.regroup_guard import RegroupGuardPass, apply_regroup_guard
from tests.graphbuilder import G

C = (1024,)


def _scale_gradient() -> G:
    """A batch norm's scale gradient `Mul(AddN, Rsqrt)` read through an IdentityN (also
    read by an Identity nothing reads, as Keras' optimizer leaves them) by the optimizer's
    `grad * lr`; a momentum product and an update after it."""
    g = G()
    g.op("a", "Placeholder", shape=C)
    g.op("b", "Placeholder", shape=C)
    g.op("rsqrt", "Rsqrt", "a", shape=C)
    g.op("gradients/AddN", "AddN", "a", "b", shape=C)
    g.op("gradients/dscale", "Mul", "gradients/AddN", "rsqrt", shape=C)
    g.op("sgd/Identity", "Identity", "gradients/dscale", shape=C)
    g.op("sgd/IdentityN", "IdentityN", "gradients/dscale", "b", shape=C, n_out=2)
    g.op("lr", "Const", shape=())
    g.op("sgd/step", "Mul", "sgd/IdentityN", "lr", shape=C)
    g.op("sgd/product", "Mul", "b", "lr", shape=C)
    g.op("sgd/new", "Sub", "sgd/product", "sgd/step", shape=C)
    g.op("w", "VarHandleOp", shape=())
    g.op("sgd/update", "AssignVariableOp", "w", "sgd/new", shape=())
    g.op("gradients/later", "Relu", "sgd/IdentityN:1", shape=C)
    g.op("v", "VarHandleOp", shape=())
    g.op("sgd/other_update", "AssignVariableOp", "v", "a", shape=())
    return g


def test_a_product_of_two_shapes_is_a_tree_looked_for_through_forwarders():
    index = _scale_gradient().index()
    trees = regrouped_trees(index)
    assert len(trees) == 1
    tree = trees[0]
    assert tree.family == MUL
    assert index.names[tree.root] == "sgd/step"
    assert [index.names[m] for m in tree.members] == ["gradients/dscale"]
    assert [index.names[f] for f in tree.forwarders] == ["sgd/IdentityN"]


def test_trees_grappler_rebuilds_in_the_same_order_are_left_out():
    g = G()
    for x in "abc":
        g.op(x, "Placeholder", shape=C)
    g.op("left", "AddV2", "a", "b", shape=C)  # (a + b) + c: AddN(a, b, c) adds alike
    g.op("sum", "AddV2", "left", "c", shape=C)
    g.op("p", "Mul", "a", "b", shape=C)  # one shape: MinimizeBroadcasts leaves it
    g.op("prod", "Mul", "p", "c", shape=C)
    g.op("right", "AddV2", "b", "c", shape=C)  # a + (b + c) is not a + b + c
    g.op("sum2", "AddV2", "a", "right", shape=C)
    g.op("int", "Mul", "a", "b", shape=C, dtype=3)  # integers are exact
    g.op("int2", "Mul", "int", "c", shape=(), dtype=3)
    trees = regrouped_trees(g.index())
    index = g.index()
    assert [(t.family, index.names[t.root]) for t in trees] == [(ADD, "sum2")]


def test_a_tree_with_a_control_edge_in_the_original_is_not_one():
    g = _scale_gradient()
    g.op("first", "NoOp", shape=())
    g.graph_def.node[4].input.append("^first")  # gradients/dscale waits for it
    assert regrouped_trees(g.index()) == []


def test_edges_leaving_a_tree_move_to_its_root_and_edges_into_it_are_dropped():
    original = _scale_gradient().index()
    g = _scale_gradient()
    nodes = {n.name: n for n in g.graph_def.node}
    nodes["sgd/product"].input.append("^gradients/dscale")  # held back for the gradient
    nodes["gradients/dscale"].input.append("^sgd/other_update")  # an early update's edge
    index = g.index()
    plan = apply_regroup_guard(index, original)
    assert (plan.trees, plan.edges_moved, plan.edges_dropped, plan.trees_changed) == (1, 1, 1, 0)
    assert list(nodes["sgd/product"].input) == ["b", "lr", "^sgd/step"]
    assert list(nodes["gradients/dscale"].input) == ["gradients/AddN", "rsqrt"]
    step, product = index.id_of["sgd/step"], index.id_of["sgd/product"]
    assert index.control_inputs[product] == [step]
    assert index.control_inputs[index.id_of["gradients/dscale"]] == []


def test_an_edge_into_a_write_that_cannot_move_stays():
    """A sum's root must stay free too; with no single reader to move to, an edge from the
    tree into a write (keeping the write after a read) stays, and the tree is counted."""
    def graph() -> G:
        g = G()
        for x in "abc":
            g.op(x, "Placeholder", shape=C)
        g.op("right", "AddV2", "b", "c", shape=C)
        g.op("sum", "AddV2", "a", "right", shape=C)
        g.op("r1", "Relu", "sum", shape=C)
        g.op("r2", "Relu", "sum", shape=C)
        g.op("w", "VarHandleOp", shape=())
        g.op("write", "AssignVariableOp", "w", "a", shape=())
        return g
    original = graph().index()
    g = graph()
    write = next(n for n in g.graph_def.node if n.name == "write")
    write.input.append("^right")
    plan = apply_regroup_guard(g.index(), original)
    assert (plan.edges_moved, plan.edges_dropped, plan.trees_changed) == (0, 0, 1)
    assert "^right" in write.input


@pytest.mark.tf
def test_a_keras_batch_norm_step_trains_bit_for_bit_with_grappler_on(tmp_path, monkeypatch):
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.tf2_steps import save_batch_norm_step

    src = save_batch_norm_step(tmp_path / "bn")

    def rewrite_and_train(name: str):
        out = tmp_path / name
        result = rewrite_file(src, out, RewriteOptions("none", [], 16))
        assert result.early.held_back > 0
        return result, verify(str(src), str(out), RunSpec(batch_size=16), 3, 0.0, 0.0)

    result, run = rewrite_and_train("guarded")
    assert result.passes["regroup guard"].edges_moved > 0
    assert run.same_training, run.mismatches
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0
    # the contrast: without the guard, the held-back edge changes what Grappler regroups
    monkeypatch.setattr(RegroupGuardPass, "enabled", lambda self, options: False)
    result, run = rewrite_and_train("unguarded")
    assert "regroup guard" not in result.passes
    assert not run.same_training and run.max_variable_diff < 1e-6


def test_a_shape_reader_does_not_hide_a_tree():
    """The `Shape` a sum's gradient reads of each operand is folded away by Grappler
    before its arithmetic optimizer's second round, which then rebuilds the sum (Keras
    NASNetMobile: a batch norm's `add_1`, read by a cell's add and by that `Shape`)."""
    g = G()
    for x in "abc":
        g.op(x, "Placeholder", shape=C)
    g.op("bias", "Placeholder", shape=(1,))
    g.op("inner", "AddV2", "a", "bias", shape=C)  # two shapes: Grappler regroups
    g.op("sum", "AddV2", "inner", "b", shape=C)
    g.op("gradients/Shape", "Shape", "inner", shape=(1,), dtype=3)
    trees = regrouped_trees(g.index())
    index = g.index()
    assert [(index.names[t.root], [index.names[m] for m in t.members]) for t in trees] == \
        [("sum", ["inner"])]
    g.op("r", "Relu", "inner", shape=C)  # a second reader that computes: no tree
    assert regrouped_trees(g.index()) == []
