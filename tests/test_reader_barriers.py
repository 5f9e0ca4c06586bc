"""Reader barriers: products and sums read once by an op of their family in the rewrite,
where the original op was read more, are read through an Identity Grappler keeps, and
copies are named after their originals (no TensorFlow; the training checks are in
test_grappler_rounding.py)."""

from __future__ import annotations

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.arithmetic_groups import family
from graphmem.analysis.pruning import kept_by_grappler
from graphmem.analysis.regions import analyze_regions
from graphmem.graph.names import (
    barrier_name,
    copy_name,
    copy_segment,
    is_copy,
    made_by_graphmem,
    original_name,
)
from graphmem.passes.reader_barriers import _reads_in_original, apply_reader_barriers
from graphmem.passes.recompute import apply_recompute
from tests.graphbuilder import G

X = (8, 16)


def _hard_swish(inner_product: bool = False) -> G:
    """y = x * (relu6(x) / 6) and a backward pass reading the division and `x`; with
    `inner_product`, the division is `(relu6(x) * x) / 6` instead, whose inner product
    Grappler may fold into it."""
    g = G()
    g.op("x", "Placeholder", shape=X)
    g.op("r", "Relu6", "x", shape=X)
    g.op("six", "Const", shape=())
    if inner_product:
        g.op("rx", "Mul", "r", "x", shape=X)
        g.op("s", "RealDiv", "rx", "six", shape=X)
    else:
        g.op("s", "RealDiv", "r", "six", shape=X)
    g.op("y", "Mul", "x", "s", shape=X)
    g.op("out", "Relu", "y", shape=X)
    g.op("gradients/g", "Sigmoid", "out", shape=X)
    g.op("gradients/ds", "Mul", "gradients/g", "x", shape=X)
    g.op("gradients/dx", "Mul", "gradients/g", "s", shape=X)
    g.op("gradients/dr", "Relu6Grad", "gradients/ds", "r", shape=X)
    return g


def _rewrite(g: G, checkpoints=("x", "y")):
    original = g.index()
    regions = analyze_regions(original)
    facts = analyze_forward(original, regions)
    plan = apply_recompute(original, regions, facts,
                           [(original.id_of[c], 0) for c in checkpoints])
    assert plan.copied_ops > 0
    new = g.index()
    plan = apply_reader_barriers(new, original)
    return original, g.index(), plan


def _barred(ix) -> dict[str, str]:
    """barrier's input -> the barrier's one reader, for every barrier of `ix`."""
    out = {}
    for b in range(len(ix)):
        if "/graphmem_barrier" in ix.names[b] and kept_by_grappler(ix, b):
            assert ix.ops[b] == "Identity"
            (reader,) = ix.data_consumers(b)
            out[ix.names[ix.data_inputs[b][0][0]]] = ix.names[reader]
    return out


def test_a_division_read_once_by_a_product_after_recompute_and_its_copy_are_barred():
    original, new, plan = _rewrite(_hard_swish())
    assert family(original, original.id_of["s"]) == "mul"  # a division by a constant
    copy = copy_name("s", "s1")
    barred = _barred(new)
    # the forward product reads the division through its barrier, the gradient the copy's
    assert barred == {"s": "y", copy: "gradients/dx"}
    assert new.names[new.data_inputs[new.id_of["y"]][1][0]] == barrier_name("s")
    assert plan.barriers == 2
    # `r` (a Relu6, no product) and the gradient products (read once in the original) not


def test_an_op_grappler_could_fold_an_operand_into_is_barred_too():
    # a barrier, unlike Grappler's own marks, leaves the op the root of its own tree
    # `(r * x) / 6`, which Grappler rebuilds in the original
    _, new, plan = _rewrite(_hard_swish(inner_product=True))
    assert _barred(new)["s"] == "y" and plan.barriers >= 1
    assert "rx" not in _barred(new)  # read once in the original too: Grappler folds it


def _shape_read(shape, reader: str) -> G:
    g = G()
    g.op("x", "Placeholder", shape=shape)
    g.op("m", "Mul", "x", "x", shape=shape)
    g.op("out", "Relu", "m", shape=shape)
    g.op("s", "Shape", "m", shape=(2,), dtype=3)
    g.op("r", reader, "s", "s", shape=shape)
    return g


def test_a_shape_read_counts_where_grappler_keeps_it():
    # a dropout's Shape, read by its random op: kept where the batch is unknown
    ix = _shape_read((-1, 4), "StatelessRandomUniformV2").index()
    assert _reads_in_original(ix, (ix.id_of["m"], 0)) == 2
    # folded into a constant where every dimension is known
    ix = _shape_read((2, 4), "StatelessRandomUniformV2").index()
    assert _reads_in_original(ix, (ix.id_of["m"], 0)) == 1
    # folded with the broadcast gradient that alone reads it
    ix = _shape_read((-1, 4), "BroadcastGradientArgs").index()
    assert _reads_in_original(ix, (ix.id_of["m"], 0)) == 1


def test_copies_are_named_after_their_originals():
    name = copy_name("block/conv/Relu", "s3_late1")
    assert is_copy(name) and made_by_graphmem(name)
    assert original_name(name) == "block/conv/Relu"
    assert not is_copy("block/conv/Relu") and original_name("a/b") == "a/b"
    # the segment of a first copy, with or without its output index; none for the rest
    assert copy_segment(copy_name("block/conv/Relu", "s12")) == 12
    assert copy_segment(copy_name("block/conv/Relu", "s3") + ":1") == 3
    assert copy_segment(name) is None and copy_segment("block/s3:0") is None
    assert copy_segment(copy_name("a", "tcpu0s3")) is None
    # sorted among other names, a copy stays beside its original
    names = ["block/conv/Relu", "block/bn/add_1", "gradient_tape/block/mul", "z"]
    ranks = sorted([*names, name]).index
    assert ranks(name) == ranks("block/conv/Relu") + 1
    # a barrier sorts beside the op it reads
    barrier = barrier_name("block/conv/Relu")
    assert made_by_graphmem(barrier) and not is_copy(barrier)
    assert sorted([*names, barrier]).index(barrier) == ranks("block/conv/Relu") + 1


def test_a_barrier_never_takes_a_name_the_graph_holds():
    # a graph graphmem rewrote before may hold a barrier of the op already
    g = _hard_swish()
    g.op(barrier_name("s"), "Identity", "r", shape=X)
    _, new, plan = _rewrite(g)
    assert plan.barriers >= 1
    names = [n.name for n in new.graph_def.node]
    assert len(names) == len(set(names))
    assert _barred(new)["s"] == "y"
    assert new.names[new.data_inputs[new.id_of["y"]][1][0]] == barrier_name("s") + "_1"
