"""Leading dimensions that are unknown in a graph's static shapes and are not the batch size.

A static shape with an unknown leading dimension (`[-1, 512]`) is sized with the batch size
everywhere in graphmem: that is what a placeholder's or a train step's input `[None, ...]`
means. Not every such dimension is the batch, though. A `Reshape` to `[-1, n]` folds every
leading axis into its first one: Keras' `Dense` on a 3- or 4-D input is a `Tensordot`,
whose `MatMul` reads and writes `[batch x positions, n]`, and a transformer's or a
ConvNeXt's step holds hundreds of those. Taken for the batch size, each is sized
`positions` times too small (a ConvNeXt block's 37 MiB output as 12 KiB), the simulated
peak drops below the real one and a plan that keeps them looks cheap.

TensorFlow's shape inference at a fixed batch size resolves these in TF1 graphs whose
inner dimensions are unknown (`Workspace.refine_shapes`), but not in a TF2 step's function
graph, nor where only the leading dimension is unknown. `resolve_leading_dims` does the
part that matters for sizes, in time linear in the part of the graph it reaches: a
reshape's leading dimension from its input's element count at the batch size, carried to
the ops that read it (a `MatMul`'s rows, element-wise ops, gradients of the same rank).
"""

from __future__ import annotations

from heapq import heappop, heappush
from math import prod
from typing import Protocol

from google.protobuf.message import Message

Tensor = tuple[int, int]


class GraphIndex(Protocol):
    """What this module reads of `index.GraphIndex` (which calls it: no import back)."""

    ops: list[str]
    position: list[int]
    num_outputs: list[int]
    data_inputs: list[list[Tensor]]

    def shape(self, t: Tensor) -> list[int] | None: ...
    def node(self, i: int) -> Message: ...
    def data_consumers(self, i: int) -> list[int]: ...


# ops whose output's leading dimension is set by their shape argument, not by an input's
_RESHAPES = frozenset({"Reshape"})
# ops whose output rows are those of their first input (unless it is read transposed)
_MATMULS = {"MatMul": "transpose_a", "_FusedMatMul": "transpose_a"}
# ops whose output's leading axis is not any input's: an unknown one is left to the batch
# size, as before (a concatenation or a slice along it, a tile, a pad)
_OWN_LEADING = frozenset({"ConcatV2", "Concat", "Slice", "StridedSlice", "Tile", "Pad",
                          "PadV2", "MirrorPad", "Gather", "GatherV2", "GatherNd", "Fill",
                          "Range", "Where", "Unique", "OneHot", "Transpose",
                          "ConjugateTranspose", "Shape", "ShapeN", "Size", "Rank"})


def resolve_leading_dims(index: GraphIndex, batch_size: int | None) -> dict[Tensor, int]:
    """Outputs whose static shape's unknown leading dimension is known to be other than
    `batch_size` at that batch size, with its value. Empty without a batch size or when
    no reshape folds axes into its leading one (most TF1 graphs: every entry then is the
    batch size, as sized before)."""
    if not batch_size:
        return {}
    ops = index.ops
    position = index.position
    heap = [(position[i], i) for i in range(len(ops))
            if (ops[i] in _RESHAPES or ops[i] in _MATMULS)
            and _leading_unknown(index.shape((i, 0)))]
    if not heap:
        return {}
    heap.sort()
    queued = {i for _, i in heap}
    found: dict[Tensor, int] = {}
    # nodes are taken in topological position: every input of a node that can change its
    # leading dimension was resolved before it (consumers always come later)
    while heap:
        _, i = heappop(heap)
        changed = False
        for k in range(index.num_outputs[i]):
            shape = index.shape((i, k))
            if not _leading_unknown(shape):
                continue
            rows = _rows(index, i, k, shape, found, batch_size)
            if rows is not None and rows != batch_size:
                found[(i, k)] = rows
                changed = True
        if changed:
            for c in index.data_consumers(i):
                if c not in queued:
                    queued.add(c)
                    heappush(heap, (position[c], c))
    return found


def _rows(index: GraphIndex, i: int, k: int, shape: list[int], found: dict[Tensor, int],
          batch_size: int) -> int | None:
    """Output k's leading dimension at the batch size, None when not known."""
    op = index.ops[i]
    ins = index.data_inputs[i]
    if not ins or op in _OWN_LEADING:
        return None
    if op in _RESHAPES:
        if k or any(d < 0 for d in shape[1:]):
            return None
        n = _elements(index, ins[0], found, batch_size)
        rest = prod(shape[1:])
        return n // rest if n is not None and rest > 0 and n % rest == 0 else None
    if op in _MATMULS:
        return _matmul_rows(index, i, k, found, batch_size)
    # element-wise ops, activations and their gradients, bias adds: the leading dimension
    # of their inputs of the same rank (the largest, for a broadcast of a size-1 axis)
    rank = len(shape)
    if op == "IdentityN":  # output k is input k
        ins = ins[k:k + 1]
    rows = [found.get(t, batch_size) for t in ins
            if (s := index.shape(t)) is not None and len(s) == rank and _leading_unknown(s)]
    return max(rows) if rows else None


def _matmul_rows(index: GraphIndex, i: int, k: int, found: dict[Tensor, int],
                 batch_size: int) -> int | None:
    """A matmul's output rows: its first input's (its columns when read transposed). A
    `Tensordot` reshapes that input with a shape computed at run time (`[-1, -1]`
    statically): its contraction dimension is then the second input's, and its rows are
    its element count over that."""
    node = index.node(i)
    ins = index.data_inputs[i]
    a, b = index.shape(ins[0]), index.shape(ins[1]) if len(ins) > 1 else None
    if k or a is None or len(a) != 2 or b is None or len(b) != 2:
        return None
    transpose_a = _MATMULS[index.ops[i]] in node.attr and node.attr[_MATMULS[index.ops[i]]].b
    transpose_b = "transpose_b" in node.attr and node.attr["transpose_b"].b
    # rows: the first input's elements over its contraction dimension, which when unknown
    # is the second input's
    contraction = _dim(index, ins[0], 0 if transpose_a else 1, found, batch_size) \
        or _dim(index, ins[1], 1 if transpose_b else 0, found, batch_size)
    n = _elements(index, ins[0], found, batch_size)
    return n // contraction if n is not None and contraction and n % contraction == 0 \
        else None


def _dim(index: GraphIndex, t: Tensor, axis: int, found: dict[Tensor, int],
         batch_size: int) -> int | None:
    shape = index.shape(t)
    if shape is None or axis >= len(shape):
        return None
    if shape[axis] >= 0:
        return shape[axis]
    if axis:
        return None
    # only `[-1, known...]` is taken for the batch: a reshape's `[-1, -1]` is anything
    return found.get(t) if any(d < 0 for d in shape[1:]) else found.get(t, batch_size)


def _elements(index: GraphIndex, t: Tensor, found: dict[Tensor, int],
              batch_size: int) -> int | None:
    """Elements of tensor t at the batch size; through reshapes whose static shape is
    unknown (a reshape keeps its input's element count)."""
    for _ in range(8):
        shape = index.shape(t)
        if shape is None:
            return None
        if all(d >= 0 for d in shape[1:]):
            lead = found.get(t, batch_size) if _leading_unknown(shape) else prod(shape[:1])
            return lead * prod(shape[1:])
        if index.ops[t[0]] not in _RESHAPES or not index.data_inputs[t[0]]:
            return None
        t = index.data_inputs[t[0]][0]
    return None


def _leading_unknown(shape: list[int] | None) -> bool:
    return bool(shape) and shape[0] < 0
