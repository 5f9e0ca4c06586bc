"""Weight-decay joins: a layer's gradient summed with a term made from the weight alone.

An L2 weight decay (tf-slim's `l2_regularizer`, Keras' `kernel_regularizer`) adds to each
weight's gradient a term `scale * w` (`L2Loss_grad/mul`: a `Mul` of the weight's value and a
scalar from the loss). TensorFlow sums the two in an `AddN` (or `Add`), which needs both
weight-sized tensors at once: on networks whose fully connected weights are the largest
tensors of the step (tf-slim's AlexNet and VGG: 100 and 392 MiB for fc6) that pair is the
peak's floor, whatever recompute plan is chosen. Computing the term in pieces and adding each
piece into the gradient's own buffer (passes/in_place_terms.py) holds the gradient and one
piece instead, with the same values: `g + scale * w`, element by element.

A join qualifies when it sums exactly two tensors of one static float shape, one of them
the only use of a `Mul` of a parameter read (a variable's value, read for this term) and a
scalar, the other the layer's gradient in a buffer no other op can read (the pass adds into
it in place): made by a kernel that allocates its output or takes over only a buffer nothing
else holds (`EXCLUSIVE_OUTPUT_OPS`), passed on through Identity and Reshape ops, each tensor
read once, and no op of that chain with a twin elsewhere (same op, same inputs), which
Grappler's common-subexpression pass could merge with it and so give the buffer a second
reader; and the term is at least MIN_BYTES. One pass over the ops: linear in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.regions import Regions, is_parameter_read
from graphmem.graph import dtypes
from graphmem.graph.index import SUM_OPS, GraphIndex, Tensor

MIN_BYTES = 16 * 2 ** 20  # smaller terms are not worth the extra ops
# about how many pieces a term is computed in: where the gradient is the step's peak (tf-slim
# OverFeat's fc6, 432 MiB; AlexNet's, 100 MiB, once they wait for the backward pass's lowest
# point) one piece lies on top of it, 1/64 of it (16 pieces measured 459-463 MiB there)
PIECES = 64
MIN_PIECE_BYTES = 2 ** 20  # ... but none smaller than this
# kernels whose output buffer is their own: allocated, or an input's that TF forwards only
# when nothing else holds it (never a view of another tensor)
EXCLUSIVE_OUTPUT_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2DBackpropFilter",
    "Conv2DBackpropFilterV2", "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter",
    "AddN", "Add", "AddV2"})
_PASS_ON_OPS = frozenset({"Identity", "Reshape"})  # hand on their input's buffer


@dataclass(frozen=True)
class DecayJoin:
    join: int  # the AddN / Add / AddV2 summing the two
    gradient: Tensor  # the layer's own gradient
    term: int  # the Mul making the decay term
    weight: Tensor  # its weight-sized operand (a parameter read)
    scalar: Tensor  # its scalar operand
    weight_first: bool  # the Mul's operand order (kept: the same op, the same rounding)
    shape: tuple[int, ...]
    dtype: int
    bytes: int  # of the term (and of the gradient)
    pieces: int  # the term is computed in this many pieces of bytes // pieces each

    @property
    def piece_bytes(self) -> int:
        return self.bytes // self.pieces


def decay_joins(index: GraphIndex, regions: Regions) -> list[DecayJoin]:
    """The weight-decay joins of the backward pass, in graph order (see the module)."""
    out = []
    backward = regions.backward
    for j in sorted(backward):
        if index.ops[j] not in SUM_OPS or index.in_loop(j):
            continue
        found = _decay_join(index, backward, j)
        if found is not None:
            out.append(found)
    return out


def _decay_join(index: GraphIndex, backward: set[int], j: int) -> DecayJoin | None:
    inputs = index.data_inputs[j]
    if len(inputs) != 2 or inputs[0] == inputs[1] or index.num_outputs[j] != 1:
        return None
    dtype, shape = index.dtype((j, 0)), index.shape((j, 0))
    if dtype not in dtypes.FLOATS or not shape or any(d is None or d < 1 for d in shape):
        return None
    elements = 1
    for d in shape:
        elements *= d
    size = elements * (dtypes.itemsize(dtype) or 0)
    if size < MIN_BYTES:
        return None
    for k, (m, slot) in enumerate(inputs):
        term = _term(index, backward, m, slot, j, shape)
        if term is None or not _owned(index, inputs[1 - k], j):
            continue
        pieces = _pieces(elements, size)
        if pieces is None:
            return None
        weight, scalar, weight_first = term
        return DecayJoin(j, inputs[1 - k], m, weight, scalar, weight_first, tuple(shape),
                         dtype, size, pieces)
    return None


def _term(index: GraphIndex, backward: set[int], m: int, slot: int, join: int,
          shape: list[int]) -> tuple[Tensor, Tensor, bool] | None:
    """(weight, scalar, weight first) when tensor (m, slot) is a decay term read only by
    `join`."""
    if index.ops[m] != "Mul" or slot != 0 or m not in backward or index.in_loop(m):
        return None
    if index.consumers.get((m, 0), []) != [join] or index.control_consumers[m]:
        return None
    ins = index.data_inputs[m]
    if len(ins) != 2:
        return None
    for k in (0, 1):
        w, s = ins[k], ins[1 - k]
        if index.shape(s) == [] and index.shape(w) == list(shape) and \
                index.dtype(w) == index.dtype(s) and is_parameter_read(index, w[0]):
            return w, s, k == 0
    return None


def _owned(index: GraphIndex, t: Tensor, reader: int) -> bool:
    """Is tensor `t`'s buffer read by `reader` alone (see the module docstring)?"""
    for _ in range(16):
        i = t[0]
        if index.consumers.get(t, []) != [reader] or _has_twin(index, i):
            return False
        op = index.ops[i]
        if op in EXCLUSIVE_OUTPUT_OPS:
            return index.num_outputs[i] == 1
        if op not in _PASS_ON_OPS or t[1] != 0 or not index.data_inputs[i]:
            return False
        reader, t = i, index.data_inputs[i][0]
    return False


def _has_twin(index: GraphIndex, i: int) -> bool:
    """Another op of the same type reading the same tensors (a candidate for Grappler's
    common-subexpression elimination)."""
    ins = index.data_inputs[i]
    if not ins:
        return False
    return any(c != i and index.ops[c] == index.ops[i] and index.data_inputs[c] == ins
               for c in index.consumers.get(ins[0], []))


def _pieces(elements: int, size: int) -> int | None:
    """A divisor of `elements` near PIECES (so the term reshapes to [pieces, rest]), with
    pieces of at least MIN_PIECE_BYTES; None when there is none within 4x of it."""
    want = max(2, min(PIECES, size // MIN_PIECE_BYTES))
    for p in range(want, 4 * want + 1):
        if elements % p == 0:
            return p
    return None
