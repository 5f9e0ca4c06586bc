"""Reader tags: keep Grappler from folding an op into its reader's product or sum where
the rewrite took the op's other readers away, as the op's other readers kept it out in
the original.

Grappler's arithmetic optimizer folds a `Mul` or `Add` op into its reader's tree only
when that reader is the op's one data reader (MinimizeBroadcasts, AddOpsRewrite), and
rebuilds the tree with its operands sorted by shape, which rounds differently
(analysis/arithmetic_groups.py). Recompute points an activation's gradient readers at a
copy: an op read by its forward reader and by a gradient op in the original is then read
once in the rewrite, its copy once too, and Grappler rebuilds what it left alone in the
original. Keras' hard swish, `x * (relu6(x + 3) / 6)` (MobileNetV3): constant folding
makes the division by 6 a product, the division is read by the forward product and by
the product's gradient, and once the gradient reads a copy, Grappler multiplied `x` by
1/6 first, in the forward pass and in the gradient: every hard swish rounded differently,
and training drifted from the original's by float rounding.

Both stages leave alone an op marked with their own tags, the marks they put on the ops
they have rebuilt so as not to rebuild them twice. The pass puts both marks on each such
op and on each copy whose original was read more than once where it is read once, when
the op had no operand Grappler would fold into it (a mark also keeps an op from being the
root of a tree): Grappler then treats it as it treated the original op, and keeping
those readers on the original instead would hold the activation the rewrite frees.
Marks change no value and no order. Constant folding's own single-reader rewrite (a
constant pushed down a product) does not read the marks; where an op it could rewrite is
left with one reader, the plan counts it.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.arithmetic_groups import family, live_reads
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import original_name
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

# the attributes Grappler's arithmetic optimizer marks the ops of a rebuilt tree with
GRAPPLER_TAGS = ("_grappler_ArithmeticOptimizer_MinimizeBroadcasts",
                 "_grappler_ArithmeticOptimizer_AddOpsRewriteStage")


@dataclass
class ReaderTagsPlan(PassPlan):
    tagged: int = 0  # ops and copies marked: read once where the original op was read more
    left_alone: int = 0  # such ops not marked: Grappler could fold an operand into them

    @property
    def changed(self) -> bool:
        return self.tagged > 0


def _folds_operand(index: GraphIndex, i: int, f: str) -> bool:
    """Whether an operand of op i is an op of its family read once: Grappler may fold it
    into a tree rooted at i, which a mark would stop."""
    for s in index.data_inputs[i]:
        if family(index, s[0]) == f and len(live_reads(index, s)) == 1:
            return True
    return False


def apply_reader_tags(index: GraphIndex, original: GraphIndex) -> ReaderTagsPlan:
    """Mark the ops of `index` (and copies) read once whose op in `original` was read more
    than once (`original`: the graph before the passes, whose ids hold in `index`)."""
    plan = ReaderTagsPlan()
    size = len(original)
    nodes = index.graph_def.node
    for j in range(len(index)):
        if j < size:
            i = j
        else:
            name = original_name(index.names[j])
            if name == index.names[j]:
                continue  # an op a pass made, not a copy
            i = original.id_of.get(name)
            if i is None:
                continue
        f = family(original, i)
        if f is None or len(live_reads(index, (j, 0))) != 1:
            continue
        if len(live_reads(original, (i, 0))) < 2:
            continue
        if _folds_operand(original, i, f):
            plan.left_alone += 1
            continue
        attr = nodes[j].attr
        for tag in GRAPPLER_TAGS:
            attr[tag].b = True
        plan.tagged += 1
    return plan


class ReaderTagsPass(Pass):
    """Ops read once where the original op was read more are marked for Grappler."""

    name, edits = "reader tags", Edits.ATTRS

    def applies(self, context: PassContext) -> bool:
        return any(p.changed for p in context.plans.values())

    def run(self, context: PassContext) -> ReaderTagsPlan:
        return apply_reader_tags(context.index, context.given_index)
