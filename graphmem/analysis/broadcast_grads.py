"""What the gradients of broadcasting ops cost once the shapes are known.

The gradient of a broadcasting binary op (`Add`, `Mul`, `Sub`, `SquaredDifference`, a
dropout's `SelectV2`, ...) reduces the incoming gradient to each input's shape:
`Sum(grad, BroadcastGradientArgs(Shape(x), Shape(y))[k])`, then `Reshape(sum, Shape(x))`.
Most such ops do not broadcast at all (a residual add, a GELU's products), and two facts
follow that the graph as written does not show:

- At run time a reduction over nothing copies no data: TF's `ReductionOp` hands back its
  input buffer when every reduced axis has size 1 or there is none ("reduces nothing" in
  `reduction_ops_common.h`). Such a `Sum` allocates nothing: `forwarding_reductions`.
- Before the step, Grappler's constant folding materializes `BroadcastGradientArgs` of two
  shapes it knows to be equal, and its arithmetic optimizer drops a `Reshape` to the shape
  the value already has; the `Shape` ops are then read by nothing and pruned, and no longer
  hold `x` and `y`. That matters in TF1 graphs whose gradients were built under
  `control_dependencies(UPDATE_OPS)`: those `Shape` ops wait for the forward pass to end
  and would keep a batch-norm output alive until then (traced on the ResNet fixture: 10 of
  its 12 residual adds lose their `Shape` ops). Grappler decides on symbolic shapes; equal
  static shapes at the batch size stand in for them here: `folded_shape_ops`.

Both are linear: one look at each reduction, `BroadcastGradientArgs` and `Shape` op.
"""

from __future__ import annotations

import math

from graphmem.graph.index import GraphIndex, Tensor

# TF's ReductionOp kernels: the "reduces nothing" case shares the input buffer
REDUCTION_OPS = frozenset({"Sum", "Mean", "Prod", "Max", "Min", "All", "Any",
                           "EuclideanNorm"})


def forwarding_reductions(index: GraphIndex, nodes: set[int] | None,
                          batch_size: int | None) -> set[int]:
    """Reductions of `nodes` that reduce nothing at run time (their output is their data
    input's buffer): the output has as many elements as the input, or the axes come from a
    `BroadcastGradientArgs` whose side needs no reduction."""
    out: set[int] = set()
    ops, data_inputs = index.ops, index.data_inputs
    for i in (nodes if nodes is not None else range(len(index))):
        if ops[i] not in REDUCTION_OPS or len(data_inputs[i]) < 2:
            continue
        data, axes = data_inputs[i][0], data_inputs[i][1]
        n_in = index.num_elements(data, batch_size)
        if n_in is None:
            continue
        n_out = index.num_elements((i, 0), batch_size)
        if n_out == n_in or _broadcast_side_unreduced(index, axes, batch_size):
            out.add(i)
    return out


def folded_shape_ops(index: GraphIndex, nodes: set[int], batch_size: int | None) -> set[int]:
    """`BroadcastGradientArgs` of two equal shapes, and the `Shape` ops feeding them that
    Grappler prunes: every reader of such a `Shape` is one of those, or a `Reshape` to the
    shape its value already has."""
    ops, data_inputs = index.ops, index.data_inputs
    folded: set[int] = set()
    for i in nodes:
        if ops[i] != "BroadcastGradientArgs" or len(data_inputs[i]) != 2:
            continue
        shapes = [_shape_read(index, t, batch_size) for t in data_inputs[i]]
        if shapes[0] is not None and shapes[0] == shapes[1]:
            folded.add(i)
    if not folded:
        return folded
    removed = set(folded)
    for b in folded:
        for s, _ in data_inputs[b]:
            if s in removed or ops[s] != "Shape":
                continue
            if all(_drops_read(index, c, s, folded, batch_size)
                   for c in index.data_consumers(s) if c in nodes):
                removed.add(s)
    return removed


def folded_readers(index: GraphIndex, nodes: set[int], folded: set[int]) -> set[int]:
    """Ops of `nodes` that Grappler turns into Identity ops once the ops of `folded`
    (`folded_shape_ops`) are gone, and its dependency optimizer then removes: a reduction
    whose axes were a folded `BroadcastGradientArgs` (empty: `SimplifyReduction`), and a
    `Reshape` to a folded `Shape` (its value has that shape already). They order nothing
    at run time: what they would ready waits for their input only."""
    out: set[int] = set()
    ops = index.ops
    for i in folded:
        for c in index.data_consumers(i):
            if c not in nodes or c in folded:
                continue
            ins = index.data_inputs[c]
            if len(ins) > 1 and ins[1][0] == i and (
                    ops[c] in REDUCTION_OPS or ops[c] == "Reshape"):
                out.add(c)
    return out


def _drops_read(index: GraphIndex, reader: int, shape_op: int, folded: set[int],
                batch_size: int | None) -> bool:
    """Whether Grappler leaves `reader` no longer reading `shape_op`."""
    if reader in folded:
        return True
    if index.ops[reader] != "Reshape" or len(index.data_inputs[reader]) < 2:
        return False
    value, target = index.data_inputs[reader][0], index.data_inputs[reader][1]
    if target[0] != shape_op:
        return False
    before = index.static_shape(value, batch_size)
    if before is None and index.ops[value[0]] in REDUCTION_OPS:
        # a sum over the axes of a folded BroadcastGradientArgs reduces nothing: its
        # value has its input's shape (which static shapes do not say: the axes are
        # computed)
        ins = index.data_inputs[value[0]]
        if len(ins) > 1 and ins[1][0] in folded:
            before = index.static_shape(ins[0], batch_size)
    return before is not None and before == _shape_read(index, target, batch_size)


def _broadcast_side_unreduced(index: GraphIndex, axes: Tensor,
                              batch_size: int | None) -> bool:
    """Whether `axes` is output k of a `BroadcastGradientArgs` whose input k already has
    the broadcast shape's element count (its reduction axes all have size 1)."""
    b, k = axes
    if index.ops[b] != "BroadcastGradientArgs" or len(index.data_inputs[b]) != 2:
        return False
    shapes = [_shape_read(index, t, batch_size) for t in index.data_inputs[b]]
    if shapes[0] is None or shapes[1] is None or k > 1:
        return False
    full = _broadcast(shapes[0], shapes[1])
    return full is not None and math.prod(shapes[k]) == math.prod(full)


def _broadcast(a: list[int], b: list[int]) -> list[int] | None:
    rank = max(len(a), len(b))
    a = [1] * (rank - len(a)) + a
    b = [1] * (rank - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and x != 1 and y != 1:
            return None  # not broadcastable: the step would fail; assume nothing
        out.append(max(x, y))
    return out


def _shape_read(index: GraphIndex, t: Tensor, batch_size: int | None) -> list[int] | None:
    """The value of `t` when it is the output of a `Shape` op of a tensor whose static
    shape is known (an unknown leading dim taking the batch size)."""
    s = t[0]
    if index.ops[s] != "Shape" or not index.data_inputs[s] or t[1] != 0:
        return None
    return index.static_shape(index.data_inputs[s][0], batch_size)
