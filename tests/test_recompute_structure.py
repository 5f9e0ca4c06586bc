"""The recompute pass on synthetic graphs: structure, holding back, no cycles (no TF needed)."""

import pytest

from benchmarks.synthetic import chain_training_graph
from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.memory import estimate_memory
from graphmem.analysis.regions import analyze_regions
from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry
from graphmem.passes.checkpoints import choose_checkpoints
from graphmem.passes.recompute import COPY_SCOPE, apply_recompute


def _index(g):
    return GraphIndex.build(g, OpRegistry(use_tensorflow=False))


def _rewrite(g, policy="memory"):
    ix = _index(g)
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    choice = choose_checkpoints(policy, ix, regions, facts, None)
    before = estimate_memory(ix, nodes=regions.step_nodes(ix))
    plan = apply_recompute(ix, regions, facts, choice.tensors)
    new = _index(g)  # raises on a cycle
    new_regions = analyze_regions(new)
    after = estimate_memory(new, nodes=new_regions.step_nodes(new))
    return ix, regions, choice, plan, new, before, after


@pytest.mark.parametrize("residual", [False, True])
def test_memory_policy_on_a_chain(residual):
    g = chain_training_graph(36, batch=256, residual=residual)
    ix, regions, choice, plan, new, before, after = _rewrite(g)
    assert not choice.fallback
    # about sqrt(N) checkpoints, all of them bottlenecks of the spine
    n_saved = len([s for s in regions.saved if s.name != "x:0"])
    assert abs(len(choice.tensors) - n_saved ** 0.5) <= 2
    assert plan.copied_ops > 0 and not plan.not_held_back
    # every copy waits for a backward op: it cannot run during the forward pass
    copies = [i for i in range(len(new)) if new.names[i].startswith(COPY_SCOPE + "/")]
    assert len(copies) == plan.copied_ops
    backward_names = {ix.names[i] for i in regions.backward}
    for c in copies:
        assert any(new.names[a] in backward_names for a in new.ancestors([c])), new.names[c]
    # no backward op reads a recomputed activation's original any more
    kept = {ix.tensor_name(t) for t in choice.tensors}
    for s in regions.saved:
        if s.name in kept or s.name == "x:0":
            continue
        i = new.id_of[ix.names[s.tensor[0]]]
        readers = new.consumers.get((i, s.tensor[1]), [])
        assert not [r for r in readers if new.names[r] in backward_names], s.name
    assert after.peak_bytes < 0.7 * before.peak_bytes


def test_skip_every_layer_falls_back_to_cuts():
    # a long skip from the input to every layer's end: no bottleneck survives
    g = chain_training_graph(16, residual=True)
    for node in g.node:
        if node.name.endswith("/skip"):
            node.input[1] = "layer_0/Relu"
    ix, regions, choice, plan, new, before, after = _rewrite(g)
    assert choice.fallback and choice.tensors
    assert "fallback" in choice.note
    assert after.peak_bytes <= before.peak_bytes


def test_speed_policy_keeps_matmuls():
    g = chain_training_graph(8)
    ix, regions, choice, plan, new, before, after = _rewrite(g, "speed")
    assert choice.tensors and all(ix.ops[t[0]] == "MatMul" for t in choice.tensors)
    assert len(choice.tensors) == 8


def test_groups_holding_each_other_back_do_not_form_a_cycle():
    # two recomputed activations whose backward readers are siblings fed by one gradient
    # (the two branches of a custom-gradient swish in Keras' EfficientNet): each group's
    # nearest independent backward ancestors include the other group's reader, so the
    # copies would wait for each other
    from graphmem.passes.recompute import _triggers
    from tests.graphbuilder import G

    g = G()
    g.op("x", "Placeholder")
    g.op("a", "Relu", "x")
    g.op("b", "Sigmoid", "x")
    g.op("gradients/g", "Const")
    g.op("gradients/cA", "Mul", "gradients/g", "a")
    g.op("gradients/cB", "Mul", "gradients/g", "b")
    g.op("gradients/dA", "Mul", "gradients/cB", "a")
    g.op("gradients/dB", "Mul", "gradients/cA", "b")
    g.op("gradients/out", "AddN", "gradients/dA", "gradients/dB")
    ix = g.index()
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    names = ix.id_of
    assert names["gradients/cB"] in _triggers(ix, regions, {names["gradients/cA"],
                                                             names["gradients/dA"]})
    plan = apply_recompute(ix, regions, facts, [])
    assert plan.copied_ops == 2 and len(plan.segments) == 2  # one group per activation
    assert plan.cycle_breaks >= 1
    new = _index(g.graph_def)  # raises on a cycle
    copies = [i for i in range(len(new)) if new.names[i].startswith(COPY_SCOPE)]
    assert len(copies) == 2
    # the copy that kept its triggers still waits for a backward op
    held = [c for c in copies if new.control_inputs[c]]
    assert len(held) == 2 - plan.cycle_breaks
