"""The removed-ops guard: ordering edges the passes added on ops Grappler removes (a
broadcast gradient's `Sum` and `Reshape`, an `Identity`) move to the ops those read or
are read by; edges of the original graph stay (no TensorFlow)."""

from __future__ import annotations

from graphmem.passes.removed_ops_guard import apply_removed_ops_guard
from tests.graphbuilder import G

X = (8, 16)


def _plumbing() -> G:
    """A product's gradient as TF writes it, `Reshape(Sum(g * s, axes), Shape(x))`, read by
    `use`; an update `upd` and a later gradient op `late` to order against."""
    g = G()
    g.op("x", "Placeholder", shape=X)
    g.op("s", "Tanh", "x", shape=X)
    g.op("gradients/g", "Sigmoid", "s", shape=X)
    g.op("gradients/m", "Mul", "gradients/g", "s", shape=X)
    g.op("gradients/Shape", "Shape", "x", shape=(2,), dtype=3)
    g.op("gradients/Shape_1", "Shape", "s", shape=(2,), dtype=3)
    g.op("gradients/BroadcastGradientArgs", "BroadcastGradientArgs", "gradients/Shape",
         "gradients/Shape_1", shape=(None,), dtype=3, n_out=2)
    g.op("gradients/Sum", "Sum", "gradients/m", "gradients/BroadcastGradientArgs", shape=X)
    g.op("gradients/Reshape", "Reshape", "gradients/Sum", "gradients/Shape", shape=X)
    g.op("gradients/use", "TanhGrad", "s", "gradients/Reshape", shape=X)
    g.op("upd", "Relu", "x", shape=X)
    g.op("late", "Relu", "gradients/g", shape=X)
    return g


def _edges(ix, names):
    return {(ix.names[u], ix.names[v]) for v in range(len(ix)) for u in ix.control_inputs[v]
            if ix.names[v] in names or ix.names[u] in names}


def test_edges_of_ours_move_off_ops_grappler_removes():
    g = _plumbing()
    node = {n.name: n for n in g.graph_def.node}
    node["gradients/Sum"].input.append("^x")  # the original's own edge
    original = g.index()
    node["gradients/Reshape"].input.append("^upd")  # ours: an update before the reshape
    node["late"].input.append("^gradients/Reshape")  # ours: an op after it
    ix = g.index()
    plan = apply_removed_ops_guard(ix, original)
    assert plan.edges_moved == 2 and plan.edges_dropped == 0
    ix = g.index()  # the graph as edited
    # into the Reshape: now into what reads it; out of it: now from what it passes on,
    # through the Sum Grappler removes too
    assert ("upd", "gradients/use") in _edges(ix, {"gradients/use"})
    assert ("gradients/m", "late") in _edges(ix, {"late"})
    assert not _edges(ix, {"gradients/Reshape"})
    assert _edges(ix, {"gradients/Sum"}) == {("x", "gradients/Sum")}  # not ours: kept


def test_an_op_grappler_keeps_keeps_its_edges():
    g = _plumbing()
    original = g.index()
    node = {n.name: n for n in g.graph_def.node}
    node["gradients/use"].input.append("^upd")
    ix = g.index()
    plan = apply_removed_ops_guard(ix, original)
    assert not plan.changed
    assert ("upd", "gradients/use") in _edges(g.index(), {"gradients/use"})
