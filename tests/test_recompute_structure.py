"""The recompute pass on synthetic graphs: structure, holding back, no cycles (no TF needed)."""

import pytest

from benchmarks.synthetic import chain_training_graph
from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.memory import estimate_memory
from graphmem.analysis.regions import analyze_regions
from graphmem.formats import load_model
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex
from graphmem.graph.names import is_copy
from graphmem.graph.opdefs import OpRegistry
from graphmem.graph.workspace import Workspace
from graphmem.passes.checkpoints import choose_checkpoints
from graphmem.passes.recompute import _release_shape_readers, apply_recompute
from tests.conftest import fixture_path


def _index(g):
    return GraphIndex.build(g, OpRegistry(use_tensorflow=False))


def _rewrite(g, policy="memory"):
    """The pass and its estimates in bytes asked for (the structure is what is tested
    here; what the allocator makes of them is tests/test_bfc.py's)."""
    ix = _index(g)
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    choice = choose_checkpoints(policy, ix, regions, facts, None)
    before = estimate_memory(ix, nodes=regions.step_nodes(ix), allocator=False)
    plan = apply_recompute(ix, regions, facts, choice.tensors)
    new = _index(g)  # raises on a cycle
    new_regions = analyze_regions(new)
    after = estimate_memory(new, nodes=new_regions.step_nodes(new), allocator=False)
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
    copies = [i for i in range(len(new)) if is_copy(new.names[i])]
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
    copies = [i for i in range(len(new)) if is_copy(new.names[i])]
    assert len(copies) == 2
    # the copy that kept its triggers still waits for a backward op
    held = [c for c in copies if new.control_inputs[c]]
    assert len(held) == 2 - plan.cycle_breaks


def _layer(name: str) -> int:
    """layer_<j> in a synthetic chain's forward or gradient op name."""
    return int(name.split("layer_", 1)[1].split("/", 1)[0])


@pytest.mark.parametrize("residual", [False, True])
def test_copies_are_held_back_one_segment_ahead(residual):
    """A segment's copies wait for a gradient op of the next segment (in backward order), so
    its recomputation can overlap that segment's gradient ops: not for an op of its own
    segment (that serializes the step), and not for one further up (that keeps more alive)."""
    g = chain_training_graph(36, batch=256, residual=residual)
    ix, regions, choice, plan, new, before, after = _rewrite(g)
    cuts = sorted(_layer(ix.names[t[0]]) for t in choice.tensors)  # checkpoint layers
    segments = sorted({s.index for s in plan.segments})
    assert len(segments) > 2
    for seg in plan.segments:
        if seg.index == segments[-1]:  # the first to run backward: nothing to overlap with
            assert not seg.ahead
            continue
        assert seg.ahead, seg
        nxt = segments[segments.index(seg.index) + 1]
        low = cuts[nxt - 1]  # the next segment's layers are low+1 .. its checkpoint's layer
        high = cuts[nxt] if nxt < len(cuts) else 36
        for name in seg.triggers:
            if nxt == segments[-1] and name.startswith("gradients/loss_grad/"):
                continue  # the gradient entering the top segment, from the loss
            assert name.startswith("gradients/layer_"), name
            assert low < _layer(name) <= high, (seg.index, name, low, high)
    # held back all the same: each copy has a backward ancestor (a copy running during the
    # forward pass would have none), and the peak is as low as before
    backward_names = {ix.names[i] for i in regions.backward}
    for c in (i for i in range(len(new)) if is_copy(new.names[i])):
        assert any(new.names[a] in backward_names for a in new.ancestors([c])), new.names[c]
    assert after.peak_bytes < 0.7 * before.peak_bytes


@pytest.mark.parametrize("residual", [False, True])
def test_without_lead_each_segment_waits_for_its_own_gradient(residual):
    """lead=False: every segment's copies wait for backward ops of their own segment (the
    gradient arriving at its readers), none one segment ahead; still held back, and the
    peak well below the original's."""
    g = chain_training_graph(36, batch=256, residual=residual)
    ix = _index(g)
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    choice = choose_checkpoints("memory", ix, regions, facts, None)
    cuts = sorted(_layer(ix.names[t[0]]) for t in choice.tensors)
    plan = apply_recompute(ix, regions, facts, choice.tensors, lead=False)
    assert plan.segments and not any(seg.ahead for seg in plan.segments)
    assert not plan.not_held_back
    for seg in plan.segments:
        low = cuts[seg.index - 1] if seg.index else -1
        high = cuts[seg.index] if seg.index < len(cuts) else 36
        for name in seg.triggers:
            if name.startswith("gradients/loss_grad/"):
                continue
            # the gradient op bringing the gradient into the segment: its own top layer's
            # or the layer just above it
            assert low < _layer(name) <= high + 1, (seg.index, name, low, high)
    new = _index(g)  # raises on a cycle
    backward_names = {ix.names[i] for i in regions.backward}
    for c in (i for i in range(len(new)) if is_copy(new.names[i])):
        assert any(new.names[a] in backward_names for a in new.ancestors([c])), new.names[c]
    before = estimate_memory(ix, nodes=regions.step_nodes(ix), allocator=False)
    after = estimate_memory(new, nodes=analyze_regions(new).step_nodes(new), allocator=False)
    assert after.peak_bytes < 0.7 * before.peak_bytes


def test_no_lead_across_checkpoints_kept_whole():
    """A budget plan keeps a run of layers whole (every saved activation a checkpoint): the
    segment below that run recomputes just in time, held back by its own triggers, not by
    the next recomputed segment's, whose backward runs before the whole run's (a lead from
    there held the copies through it: an MLP budget plan measured 1.56x its budget)."""
    g = chain_training_graph(24, batch=256)
    ix = _index(g)
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    saved = {_layer(s.name): s.tensor for s in regions.saved if s.name.startswith("layer_")}
    whole = range(8, 16)  # layers kept whole; the others recomputed, around 3 and 20
    cps = [saved[j] for j in (3, *whole, 20)]
    plan = apply_recompute(ix, regions, facts, cps)
    _index(g)  # raises on a cycle
    by_top = {}
    for seg in plan.segments:
        by_top.setdefault(max(_layer(t) for t in seg.targets), []).append(seg)
    below_gap = by_top[7]  # layers 4-7: the next segment with copies is above the run
    assert below_gap and not any(seg.ahead for seg in below_gap)
    for seg in below_gap:  # its own triggers: the gradient entering layer 8, just above it
        assert {_layer(t) for t in seg.triggers} == {8}, seg.triggers
    assert all(seg.ahead for seg in by_top[2])  # layers 0-2, next to 4-7: one segment ahead


def test_shape_readers_stop_waiting_for_the_forward_pass():
    """TF1 batch norm: backward Shape ops built under control_dependencies(UPDATE_OPS) wait for
    every moving-average update and keep the activations they measure alive until the forward
    pass ends. The rewrite hands their control inputs on to their readers."""
    ws = Workspace.open(load_model(fixture_path("resnet")), batch_size=16)
    ix = ws.index
    regions = analyze_regions(ix)

    def waiting(index, regions):
        return {index.names[i]: {index.names[c] for c in index.control_inputs[i]}
                for i in regions.backward if index.ops[i] in SHAPE_ONLY_OPS
                and index.control_inputs[i]
                and any(s in regions.forward for s, _ in index.data_inputs[i])}

    before = waiting(ix, regions)
    assert len(before) > 20
    readers_of = {name: [ix.names[d] for d in ix.data_consumers(ix.id_of[name])]
                  for name in before}
    est_before = estimate_memory(ix, 16, nodes=regions.step_nodes(ix))
    released = _release_shape_readers(ix, regions)
    new = _index(ws.graph_def)  # raises on a cycle
    new_regions = analyze_regions(new)
    left = waiting(new, new_regions)  # only readers nobody reads (nothing to hand on to)
    assert released == len(before) - len(left)
    assert all(not new.data_consumers(new.id_of[n]) and not new.control_consumers[new.id_of[n]]
               for n in left)
    for name, controls in before.items():  # every ordering the readers had is kept
        for reader in readers_of[name]:
            got = {new.names[c] for c in new.control_inputs[new.id_of[reader]]}
            assert controls <= got, (name, reader)
    est_after = estimate_memory(new, 16, nodes=new_regions.step_nodes(new))
    assert est_after.peak_bytes <= est_before.peak_bytes


def test_no_lead_trigger_that_would_close_a_cycle():
    """A backward op near the loss reads an activation of the first segment and feeds the
    whole gradient chain: the next segment's backward ops then depend on that segment's
    copies, so they must not hold them back (a cycle); that segment keeps its own triggers."""
    g = chain_training_graph(36, batch=256)
    probe = g.node.add()
    probe.name, probe.op = "gradients/probe", "Mul"
    probe.input.extend(["gradients/loss_grad/Tile", "layer_2/Relu"])
    probe.attr["T"].type = 1
    probe.attr["_output_shapes"].list.shape.add().CopyFrom(
        next(n for n in g.node if n.name == "layer_2/Relu").attr["_output_shapes"].list.shape[0])
    grad = next(n for n in g.node if n.name == "gradients/layer_35/ReluGrad")
    grad.input[0] = "gradients/probe"
    ix, regions, choice, plan, new, before, after = _rewrite(g)  # re-indexing: no cycle
    first = min(s.index for s in plan.segments)
    assert [s.ahead for s in plan.segments if s.index == first] == [False]
    assert sum(s.ahead for s in plan.segments) >= len(plan.segments) - 2


def test_unled_segments_wait_for_their_own_gradient():
    """`unled` takes the lead from the segments it names alone: they are held back by
    their own backward ops, as without a lead, and every other segment keeps the trigger
    one segment ahead it has with the lead."""

    def rewritten(**kw):
        g = chain_training_graph(36, batch=256)
        ix = _index(g)
        regions = analyze_regions(ix)
        facts = analyze_forward(ix, regions)
        choice = choose_checkpoints("memory", ix, regions, facts, None)
        plan = apply_recompute(ix, regions, facts, choice.tensors, **kw)
        _index(g)  # raises on a cycle
        return plan

    led, plain = rewritten(), rewritten(lead=False)
    ahead = [s.index for s in led.segments if s.ahead]
    assert len(ahead) >= 3
    unled = tuple(ahead[::2])
    partial = rewritten(unled=unled)
    own = {s.index: s.triggers for s in plain.segments}
    lead = {s.index: s.triggers for s in led.segments}
    assert {s.index for s in partial.segments} == set(own)
    for seg in partial.segments:
        if seg.index in unled:
            assert not seg.ahead and seg.triggers == own[seg.index]
        else:
            assert seg.ahead == (seg.index in ahead) and seg.triggers == lead[seg.index]
