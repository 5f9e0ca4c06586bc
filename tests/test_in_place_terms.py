"""Large weight-decay terms added into their gradient in pieces (passes/in_place_terms.py,
analysis/decay_terms.py): the same training bit for bit, the pair of weight-sized tensors
gone from the peak, and joins left alone where the gradient's buffer may be shared.

Found on tf-slim's AlexNet and VGG-16: their first fully connected layer's weight gradient
and its decay term (2 x 100 MiB, 2 x 392 MiB) were live together in the AddN summing them,
the floor of every recompute plan."""

import pytest

from graphmem.analysis.decay_terms import decay_joins
from graphmem.analysis.floor import step_floor
from graphmem.analysis.regions import analyze_regions
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.in_place_terms import add_terms_in_place
from graphmem.rewrite import RewriteOptions, rewrite_file
from tests.decayed_models import decayed_classifier, trained_alike
from tests.graphbuilder import G

BATCH, INPUT, HIDDEN, WIDE = 4, 64, 1024, 4096  # the wide layer's weight: 16 MiB
WEIGHT_BYTES = HIDDEN * WIDE * 4


@pytest.fixture(scope="module")
def wide_decayed(tmp_path_factory):
    """A TF1 classifier whose second layer is wide, every weight decayed."""
    return decayed_classifier(tmp_path_factory.mktemp("wide") / "wide.meta",
                              [INPUT, HIDDEN, WIDE, 10])


def test_the_wide_layers_join_is_found(wide_decayed):
    index = Workspace.open(load_model(wide_decayed)).index
    joins = decay_joins(index, analyze_regions(index))
    assert len(joins) == 1  # the other weights (256 and 160 KiB) are below MIN_BYTES
    d = joins[0]
    assert d.bytes == WEIGHT_BYTES and d.shape == (HIDDEN, WIDE)
    assert index.names[d.term] == "gradients/L2Loss_1_grad/mul"
    assert index.names[d.gradient[0]] == "gradients/MatMul_1_grad/tuple/control_dependency_1"
    assert (HIDDEN * WIDE) % d.pieces == 0 and 2 <= d.pieces <= 64


def test_floor_counts_the_gradient_and_one_piece(wide_decayed):
    index = Workspace.open(load_model(wide_decayed)).index
    regions = analyze_regions(index, batch_size=BATCH)
    (d,) = decay_joins(index, regions)
    floor = step_floor(index, regions, BATCH)
    # every op's footprint is at most the gradient plus a piece (and the input batch)
    assert floor.bytes < WEIGHT_BYTES + d.piece_bytes + 2 ** 20
    assert floor.bytes < 2 * WEIGHT_BYTES


def test_rewrite_adds_the_term_in_place_and_trains_bit_identically(wide_decayed, tmp_path):
    out = tmp_path / "none.meta"
    result = rewrite_file(wide_decayed, out, RewriteOptions("none", [], BATCH))
    plan = result.passes["in-place terms"]
    assert len(plan.terms) == 1 and plan.bytes == WEIGHT_BYTES
    index = Workspace.open(load_model(out)).index
    adds = [i for i, op in enumerate(index.ops) if op == "InplaceAdd"]
    assert len(adds) == plan.pieces
    # the update reads the pieces' sum; the AddN and the whole term are left unread, and
    # no part of the step (TF prunes them)
    regions = analyze_regions(index, batch_size=BATCH)
    step = regions.step_nodes(index)
    for name in (plan.terms[0], "gradients/L2Loss_1_grad/mul"):
        assert index.id_of[name] not in step
    assert all(i in step for i in adds)
    # early updates continue the backward chain where the layer's own gradient leaves it,
    # as without the pieces: the wide layer's update is waited for by backward ops the
    # step runs, not by the unread sum
    update = next(n for n in index.names if n.endswith("update_w1/ResourceApplyMomentum"))
    waiting = [c for c in index.control_consumers[index.id_of[update]]
               if index.names[c].startswith("gradients/")]
    assert waiting and all(c in step for c in waiting), [index.names[c] for c in waiting]
    # the estimate no longer holds two weight-sized tensors at once
    assert result.after.peak_bytes <= result.before.peak_bytes - WEIGHT_BYTES // 2
    pytest.importorskip("tensorflow")
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    for r in trained_alike(wide_decayed, out, BATCH):
        # measured: the gradient and one piece, not the gradient and the whole term
        assert r.rewritten.measured_peak_bytes < \
            r.original.measured_peak_bytes - WEIGHT_BYTES // 2, (r.original, r.rewritten)
    # and with Grappler's rewrites on (nothing it could merge the gradient's buffer with)
    r = verify(str(wide_decayed), str(out), RunSpec(batch_size=BATCH), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches


def _join(shape=(1024, 4096)) -> G:
    """A weight gradient `late` (MatMul) and a decay term Mul(read, seed), summed."""
    g = G()
    g.op("w", "VarHandleOp", shape=())
    g.op("read", "ReadVariableOp", "w", shape=shape)
    g.op("x", "Placeholder", shape=(shape[0], shape[0]))
    g.op("act", "Relu", "x", shape=(shape[0], shape[0]))
    g.op("loss", "Sum", "act", shape=())
    g.op("gradients/seed", "Fill", "loss", shape=())
    g.op("gradients/dy", "Placeholder", shape=(shape[0], shape[1]))
    g.op("gradients/late", "MatMul", "act", "gradients/dy", shape=shape)
    g.op("gradients/term", "Mul", "read", "gradients/seed", shape=shape)
    g.op("gradients/AddN", "AddN", "gradients/late", "gradients/term", shape=shape)
    g.op("apply", "ResourceApplyGradientDescent", "w", "gradients/AddN", shape=())
    return g


def _found(g: G) -> int:
    index = g.index()
    return len(decay_joins(index, analyze_regions(index)))


def test_joins_whose_gradient_buffer_may_be_shared_are_left_alone():
    assert _found(_join()) == 1
    # the gradient has a second reader: adding into its buffer would change what it reads
    g = _join()
    g.op("gradients/summary", "Sum", "gradients/late", shape=())
    g.op("apply2", "NoOp", "^gradients/summary", shape=())
    assert _found(g) == 0
    # a twin of the gradient's op (same op, same inputs): Grappler may merge the two
    g = _join()
    g.op("gradients/late_twin", "MatMul", "act", "gradients/dy", shape=(1024, 4096))
    g.op("gradients/twin_sum", "Sum", "gradients/late_twin", shape=())
    assert _found(g) == 0
    # a gradient that is a view of another tensor (a Slice hands out its input's memory)
    g = _join()
    g.op("gradients/big", "MatMul", "act", "gradients/dy", shape=(1024, 4096))
    g.op("gradients/view", "Slice", "gradients/big", shape=(1024, 4096))
    next(n for n in g.graph_def.node if n.name == "gradients/AddN").input[0] = "gradients/view"
    assert _found(g) == 0


def test_terms_read_elsewhere_or_small_are_left_alone():
    g = _join()
    g.op("gradients/waits", "NoOp", "^gradients/term", shape=())
    assert _found(g) == 0
    assert _found(_join(shape=(64, 64))) == 0  # 16 KiB: below MIN_BYTES


def test_the_pass_writes_pieces_that_cover_the_term():
    g = _join()
    index = g.index()
    (d,) = decay_joins(index, analyze_regions(index))
    plan = add_terms_in_place(index, [d])
    assert plan.pieces == d.pieces and plan.bytes == 1024 * 4096 * 4
    nodes = {n.name: n for n in index.graph_def.node}
    base = "gradients/AddN/graphmem_in_place"
    rows = sorted(nodes[f"{base}/piece_{p}/row"].attr["value"].tensor.int_val[0]
                  for p in range(d.pieces))
    assert rows == list(range(d.pieces))  # each row of [pieces, n / pieces] added once
    # each piece waits for the add before it; the update reads the result
    for p in range(1, d.pieces):
        assert f"^{base}/piece_{p - 1}/sum" in nodes[f"{base}/piece_{p}/weight"].input
    assert nodes["apply"].input[1] == f"{base}/result"
    assert list(nodes[f"{base}/piece_0/term"].input) == [f"{base}/piece_0/weight",
                                                         "gradients/seed"]
