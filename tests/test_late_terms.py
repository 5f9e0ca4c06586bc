"""Weight-decay gradient terms wait for the gradient they are added to (passes/late_terms.py).

Found on tf-slim's ResNet-50 (benchmarks/slim_models_bench.py): each `L2Loss_grad/mul`
reads only its variable and a scalar from the loss, so TF computed all of them when the
backward pass started and held ~90 MiB of them until their layer's gradient arrived."""

import pytest

from graphmem.analysis.regions import analyze_regions
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.late_terms import apply_late_terms
from graphmem.rewrite import RewriteOptions, rewrite_file
from tests.decayed_models import decayed_classifier, trained_alike
from tests.graphbuilder import G

LAYERS, WIDTH, BATCH = 6, 256, 4


@pytest.fixture(scope="module")
def decayed_mlp(tmp_path_factory):
    """A TF1 MLP whose weights outweigh its activations, its hidden layers decayed."""
    path = tmp_path_factory.mktemp("decay") / "decay.meta"
    return decayed_classifier(path, [WIDTH] * (LAYERS + 1) + [10], decay_last=False)


def test_each_decay_term_waits_for_its_layer_gradient(decayed_mlp):
    ws = Workspace.open(load_model(decayed_mlp))
    index = ws.index
    plan = apply_late_terms(index, analyze_regions(index), BATCH)
    assert plan.terms == LAYERS
    assert plan.bytes == LAYERS * WIDTH * WIDTH * 4
    new = ws.reindex()  # the edges close no cycle
    for i in range(LAYERS):
        suffix = f"_{i}" if i else ""
        term = new.id_of[f"gradients/L2Loss{suffix}_grad/mul"]
        # the edge lands on the chain's first private op (here the Identity of the scalar
        # from the loss); it comes from this layer's own weight gradient
        waits = {new.names[c] for q in [term, *(s for s, _ in new.data_inputs[term])]
                 for c in new.control_inputs[q]}
        assert f"gradients/MatMul{suffix}_grad/tuple/control_dependency_1" in waits


def test_rewrite_lowers_the_estimate_and_trains_the_same(decayed_mlp, tmp_path):
    out = tmp_path / "none.meta"
    result = rewrite_file(decayed_mlp, out, RewriteOptions("none", [], BATCH))
    assert result.early.late_terms == LAYERS
    # the original holds all six decay terms (256 KiB each) at its peak
    assert result.after.peak_bytes <= result.before.peak_bytes - 3 * WIDTH * WIDTH * 4
    pytest.importorskip("tensorflow")
    trained_alike(decayed_mlp, out, BATCH)


def _join_graph(early_reads: str, shape=(64, 64)) -> G:
    """seed -> term = Mul(w, seed) and a late gradient `late`, joined by an AddN."""
    g = G()
    g.op("w", "VarHandleOp", shape=())
    g.op("read", "ReadVariableOp", "w", shape=shape)
    g.op("x", "Placeholder", shape=shape)
    g.relu_loss("x", shape, dy="dact")
    g.op("gradients/late", "MatMul", "gradients/dact", "act", shape=shape)
    g.op("gradients/term", "Mul", early_reads, "gradients/seed", shape=shape)
    g.op("gradients/AddN", "AddN", "gradients/late", "gradients/term", shape=shape)
    g.op("apply", "ResourceApplyGradientDescent", "w", "gradients/AddN", shape=())
    return g


def test_a_term_reading_a_variable_is_deferred_one_reading_an_activation_is_not():
    for reads, deferred in (("read", 1), ("act", 0)):
        index = _join_graph(reads).index()
        plan = apply_late_terms(index, analyze_regions(index), None)
        assert plan.terms == deferred, reads
        term = index.id_of["gradients/term"]
        assert (index.id_of["gradients/late"] in index.control_inputs[term]) == bool(deferred)


def test_a_term_another_op_waits_for_is_left_alone():
    g = _join_graph("read")
    g.op("gradients/waits", "NoOp", "^gradients/term", shape=())
    index = g.index()
    assert apply_late_terms(index, analyze_regions(index), None).terms == 0


def test_decayed_weights_are_updated_as_soon_as_their_gradient_sum_exists(decayed_mlp):
    """Issue 21: a weight's gradient is an `AddN` of its layer's gradient and its decay
    term, each behind a `tuple` Identity (TF1's gate_gradients): the backward chain goes on
    two levels up, from the layer gradient's sibling (the dx matmul). Every update gets an
    edge to the backward op that continues the chain, so no weight gradient waits for the
    end of the step (tf-slim's networks held all of them)."""
    from graphmem.passes.early_updates import apply_early_updates

    ws = Workspace.open(load_model(decayed_mlp))
    index = ws.index
    regions = analyze_regions(index)
    apply_late_terms(index, regions, BATCH)
    plan = apply_early_updates(index, regions)
    # every update but the first layer's, whose gradient ends the backward pass
    assert plan.skipped == {"no backward op after the gradient": 1}, plan.skipped
    assert plan.updates == LAYERS
    new = ws.reindex()  # no cycle
    for i in range(1, LAYERS):
        update = new.id_of[f"Momentum/update_w{i}/ResourceApplyMomentum"]
        waiting = [new.names[c] for c in range(len(new)) if update in new.control_inputs[c]]
        # the chain below layer i: the gradient flowing into layer i-1's relu
        assert any(name.startswith(f"gradients/Relu{'_' + str(i - 1) if i > 1 else ''}_grad")
                   for name in waiting), waiting


def test_a_broadcast_gradient_sized_from_a_shape_op_is_deferred(monkeypatch):
    """A batch norm's mean gradient (Keras, unfused): a per-channel value broadcast to the
    activation's shape and divided by its element count, both read from `Shape` ops of the
    activation, joins the other two full-size terms of dx. TF ran it first, beside them
    (Keras MobileNetV2 at two threads: a fifth full-size buffer at the peak). A shape op
    reads only its input's metadata and makes a few bytes: it is an outside input of the
    chain, not part of it, so the full-size activation behind it does not stop the wait."""
    big = (32, 32)
    g = G()
    g.op("x", "Placeholder", shape=big)
    g.relu_loss("x", big, dy="dact")
    g.op("gradients/late", "Mul", "gradients/dact", "act", shape=big)
    g.op("gradients/dmean", "Sum", "gradients/dact", shape=(32,))  # also an offset's gradient
    g.op("gradients/shape", "Shape", "act", shape=(2,))
    g.op("gradients/count", "Prod", "gradients/shape", shape=())
    g.op("gradients/n", "Cast", "gradients/count", shape=())
    g.op("gradients/broadcast", "BroadcastTo", "gradients/dmean", "gradients/shape", shape=big)
    g.op("gradients/term", "RealDiv", "gradients/broadcast", "gradients/n", shape=big)
    g.op("gradients/AddN", "AddN", "gradients/late", "gradients/term", shape=big)
    for v, grad in (("w", "gradients/AddN"), ("b", "gradients/dmean")):
        g.op(v, "VarHandleOp", shape=())
        g.op(f"apply_{v}", "ResourceApplyGradientDescent", v, grad, shape=())
    index = g.index()
    plan = apply_late_terms(index, analyze_regions(index), None)
    assert plan.terms == 1 and plan.bytes == 32 * 32 * 4
    late = index.id_of["gradients/late"]
    waiting = {index.names[c] for c in range(len(index)) if late in index.control_inputs[c]}
    assert waiting == {"gradients/broadcast", "gradients/count"}  # the shape op runs early
    # the contrast: with the shape op taken into the chain, the activation it reads
    # would be held longer, so the term stayed where it was
    import graphmem.passes.late_terms as lt

    monkeypatch.setattr(lt, "SHAPE_ONLY_OPS", frozenset())
    index = g.index()
    assert apply_late_terms(index, analyze_regions(index), None).terms == 0
