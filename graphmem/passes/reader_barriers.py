"""Reader barriers: keep Grappler from folding an op into its reader's product or sum where
the rewrite took the op's other readers away, as the op's other readers kept it out in
the original.

Grappler folds a `Mul` or `Add` op into its reader's tree only when that reader is the
op's one data reader: its arithmetic optimizer (MinimizeBroadcasts, AddOpsRewrite)
rebuilds the tree with its operands sorted by shape, and its constant folding pushes a
constant operand of the reader down into the op (`c * (x * y)` -> `(c * x) * y`); both
round differently (analysis/arithmetic_groups.py). Recompute points an activation's
gradient readers at a copy: an op read by its forward reader and by a gradient op in the
original is then read once in the rewrite, its copy once too, and Grappler rebuilds what
it left alone in the original. Seen on Keras networks, each training differently from the
original by float rounding:

- hard swish, `x * (relu6(x + 3) / 6)` (MobileNetV3): constant folding makes the division
  by 6 a product, read by the forward product and by the product's gradient; once the
  gradient read a copy, Grappler multiplied `x` by 1/6 first;
- two consecutive residual adds copied in one group (MobileNetV3Large's speed rewrite):
  the first, read by the next block and its gradients in the original, was read by the
  second's copy alone, and Grappler summed both blocks' batch norm offsets together;
- a dropout's scale (MobileNetV3Large's last hard swish, whose product the dropout's
  `Shape` also reads in the original): constant folding pushed the scale into the copy.

Each such op whose one reader is an op of its family is read through an `Identity` that
Grappler keeps (`_grappler_do_not_remove`): the reader's tree stops there, as the other
readers stopped it in the original, and the op's own tree is rebuilt as the original's.
An Identity hands its input on without a copy: no value, no order and no byte changes.
Keeping those readers on the original instead would hold the activation the rewrite
frees. (Grappler's own marks for what it has rebuilt, tried first, also keep an op from
being the root of its own tree, and constant folding does not read them.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from graphmem.analysis.arithmetic_groups import (
    family,
    live_reads,
    reader_through_forwarders,
    reads_through_forwarders,
)
from graphmem.analysis.pruning import KEEP_ATTR
from graphmem.graph.builders import unique_name
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex, Tensor
from graphmem.graph.names import barrier_name, original_name
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

# the readers of a shape that Grappler folds away with it when a broadcast changes nothing
# (analysis/broadcast_grads.py, which decides it per op from the static shapes at a batch
# size; here the batch may be unknown, and any broadcast gradient's shape is taken)
FOLDED_SHAPE_READERS = frozenset({"BroadcastGradientArgs", "Reshape"})


@dataclass
class ReaderBarriersPlan(PassPlan):
    barriers: int = 0  # ops and copies read through a kept Identity: read once by an op
    # of their family where the original op was read more

    @property
    def changed(self) -> bool:
        return self.barriers > 0


def apply_reader_barriers(index: GraphIndex, original: GraphIndex) -> ReaderBarriersPlan:
    """Read each product or sum of `index` (or copy of one) read once by an op of its
    family, whose op in `original` (the graph before the passes, whose ids hold in
    `index`) was read more than once, through a barrier (appended to index.graph_def: the
    index is stale after)."""
    barred: list[tuple[int, int, int]] = []  # (op, its reader, the input position read)
    for j, f, reader in _read_once(index, original):
        # a reader of another family folds nothing; an Identity needs the op's dtype
        if family(index, reader) == f and index.dtype((j, 0)) is not None:
            barred.append((j, *live_reads(index, (j, 0))[0]))
    made: set[str] = set()
    for j, reader, position in barred:
        _read_through_barrier(index, j, reader, position, made)
    return ReaderBarriersPlan(barriers=len(barred))


def _read_once(index: GraphIndex, original: GraphIndex) -> Iterator[tuple[int, str, int]]:
    """(op or copy of `index`, its family, its one reader past forwarders) for each
    product or sum read once whose op in `original` was read more than once."""
    size = len(original)
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
        if f is None:
            continue
        found = reader_through_forwarders(index, (j, 0), free=True)
        if found is not None and _reads_in_original(original, (i, 0)) >= 2:
            yield j, f, found[0]


def _reads_in_original(index: GraphIndex, t: Tensor) -> int:
    """How many readers Grappler counts for tensor t: its live reads, through the
    forwarders its pruner removes, and the shape ops reading it that Grappler keeps."""
    return reads_through_forwarders(index, t, _kept_shape_reads)


def _kept_shape_reads(index: GraphIndex, t: Tensor) -> int:
    """The shape ops reading tensor t that Grappler keeps. Its constant folding replaces
    a shape by a constant only when it knows every dimension, or where a broadcast
    gradient alone reads it (`BroadcastGradientArgs` and the `Reshape` back to the
    operand's shape, both folded when the operands have one shape); a shape op nothing
    reads is pruned. A dropout's `Shape` of the activation it masks stays where the batch
    is unknown."""
    shape = index.shape(t)
    if shape is not None and all(d >= 0 for d in shape):
        return 0
    return sum(1 for r in dict.fromkeys(index.consumers.get(t, []))
               if index.ops[r] in SHAPE_ONLY_OPS and
               any(index.ops[c] not in FOLDED_SHAPE_READERS for c in index.data_consumers(r)))


def _read_through_barrier(index: GraphIndex, j: int, reader: int, position: int,
                          made: set[str]) -> None:
    """Point input `position` of op `reader` at a new Identity of op j's result, kept by
    Grappler (its pruner would bypass it). Named after op j, it sorts beside it: Grappler
    orders a commutative op's inputs by name (`made`: the names given so far; a graph
    rewritten before may hold the name already)."""
    g = index.graph_def
    node = g.node[j]
    name = unique_name(barrier_name(node.name), lambda n: n in index.id_of or n in made)
    made.add(name)
    barrier = g.node.add(name=name, op="Identity", device=node.device)
    barrier.input.append(node.name)
    barrier.attr["T"].type = index.dtype((j, 0))
    barrier.attr[KEEP_ATTR].b = True
    g.node[reader].input[position] = name


class ReaderBarriersPass(Pass):
    """Sums and products read once by their family, where the original's were read more,
    are read through an Identity Grappler keeps."""

    name, edits = "reader barriers", Edits.NODES

    def applies(self, context: PassContext) -> bool:
        return any(p.changed for p in context.plans.values())

    def run(self, context: PassContext) -> ReaderBarriersPlan:
        return apply_reader_barriers(context.own_index(), context.given_index)
