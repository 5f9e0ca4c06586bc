"""Reader tags: ops read once in the rewrite where the original op was read more are
marked as Grappler marks the products it has rebuilt, and copies are named after their
originals (no TensorFlow; the training check is in test_grappler_rounding.py)."""

from __future__ import annotations

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.arithmetic_groups import family
from graphmem.analysis.regions import analyze_regions
from graphmem.graph.names import (
    copy_name,
    copy_segment,
    is_copy,
    made_by_graphmem,
    original_name,
)
from graphmem.passes.reader_tags import GRAPPLER_TAGS, apply_reader_tags
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
    return original, new, apply_reader_tags(new, original)


def test_a_division_read_once_after_recompute_and_its_copy_are_marked():
    original, new, plan = _rewrite(_hard_swish())
    assert family(original, original.id_of["s"]) == "mul"  # a division by a constant
    s, copy = new.id_of["s"], new.id_of[copy_name("s", "s1")]
    assert new.data_consumers(s) == [new.id_of["y"]]  # the gradient reads the copy
    marked = {n.name for n in new.graph_def.node if all(t in n.attr for t in GRAPPLER_TAGS)}
    assert {"s", new.names[copy]} <= marked
    assert "r" not in marked and "gradients/dx" not in marked  # not products read more
    assert plan.tagged == len(marked) and plan.left_alone == 0


def test_an_op_grappler_could_fold_an_operand_into_is_left_unmarked():
    # a mark would also stop the op from being the root of the tree `(r * x) / 6`, which
    # Grappler rebuilds in the original: the op stays as it is, counted
    _, new, plan = _rewrite(_hard_swish(inner_product=True))
    assert plan.left_alone >= 1
    assert not any(t in new.node(new.id_of["s"]).attr for t in GRAPPLER_TAGS)


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
