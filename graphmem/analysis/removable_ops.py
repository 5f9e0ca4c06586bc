"""Ops Grappler may remove when a session starts, and so must not carry our ordering edges.

Why it matters: Grappler folds ops whose result equals an input (a gradient's `Sum` over
the axes `BroadcastGradientArgs` finds empty, the `Reshape` back to the shape it already
has, an `Identity`) and its dependency optimizer then takes the leftover `Identity` out,
moving its readers to its input, but only when that does not add edges: an op with
control outputs of ours can stay. A kept op changes the name a gradient sum reads, and
Grappler sorts an `AddN`'s inputs by name, so the sum adds its terms in another order and
rounds differently (Keras NASNetMobile: a recompute segment held back by the `Sum` of a
cell's add gradient kept it; the gradient of the cell's concat summed in another order,
and the loss drifted by 1e-2 in five steps). Our edges go to the ops these ones read
instead. A superset where unsure: passing an op that stays only moves an edge one op
earlier. (`broadcast_grads.folded_readers` finds the same reductions and reshapes where
static shapes prove Grappler folds them, for the estimate; here a possible fold is
enough.)
"""

from __future__ import annotations

from graphmem.analysis.arithmetic_groups import FORWARDERS
from graphmem.analysis.broadcast_grads import REDUCTION_OPS
from graphmem.analysis.pruning import kept_by_grappler
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex

# where the axes of a gradient's reduction come from when they may be empty
AXES_FROM = frozenset({"BroadcastGradientArgs"})
SHAPE_OPS = frozenset({"Shape", "ShapeN"})


def may_be_removed(index: GraphIndex, i: int) -> bool:
    """Whether Grappler may remove op i, its readers then reading its input (not when
    the op is marked `_grappler_do_not_remove`, as swap ops are)."""
    op = index.ops[i]
    if kept_by_grappler(index, i):
        return False
    inputs = index.data_inputs[i]
    if op in FORWARDERS or op in SHAPE_ONLY_OPS:  # shape ops: folded into constants
        return True
    if op == "AddN":
        return len(inputs) == 1
    if op in REDUCTION_OPS and len(inputs) == 2:
        axes = inputs[1][0]
        return index.ops[axes] in AXES_FROM or _empty_const(index, axes)
    if op == "Reshape" and len(inputs) == 2:
        return index.ops[inputs[1][0]] in SHAPE_OPS  # back to a tensor's own shape
    return False


def _empty_const(index: GraphIndex, i: int) -> bool:
    if index.ops[i] != "Const":
        return False
    shape = index.shape((i, 0))
    return shape is not None and 0 in shape
