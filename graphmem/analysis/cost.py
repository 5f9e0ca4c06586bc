"""How much an op costs to recompute, in floating-point operations from static shapes.

Matmuls and convolutions count their multiply-adds; every other op counts one operation per
output element. Good enough to rank plans: the budget policy compares recompute costs of
plans on the same graph, never against wall time.
"""

from __future__ import annotations

from math import prod

from graphmem.graph.index import FUNCTION_CALLS, GraphIndex
from graphmem.graph.names import is_copy

_MATMUL = {"MatMul": ("transpose_a", False), "_FusedMatMul": ("transpose_a", False),
           "BatchMatMul": ("adj_x", True), "BatchMatMulV2": ("adj_x", True),
           "BatchMatMulV3": ("adj_x", True)}
_CONV = {"Conv2D", "_FusedConv2D", "Conv3D", "DepthwiseConv2dNative", "Conv2DBackpropInput"}


def op_flops(index: GraphIndex, i: int, batch_size: int | None) -> int:
    out = index.num_elements((i, 0), batch_size)
    if out is None:
        return 1
    op = index.ops[i]
    ins = index.data_inputs[i]
    if op in _MATMUL and ins:
        attr, _ = _MATMUL[op]
        a = index.shape(ins[0])
        if a and len(a) >= 2:
            transposed = index.node(i).attr[attr].b if attr in index.node(i).attr else False
            k = a[-2] if transposed else a[-1]
            if k > 0:
                return 2 * out * k
    if op in _CONV and len(ins) >= 2:
        f = index.shape(ins[1])
        if f and len(f) >= 3 and all(d > 0 for d in f):
            per_output = prod(f[:-2]) * (1 if op == "DepthwiseConv2dNative" else f[-2])
            return 2 * out * per_output
    return max(out, 1)


# ops whose cost is a function body's or a loop's, run a number of times no shape tells:
# op_flops counts their outputs alone
_OPAQUE = FUNCTION_CALLS | {"Enter"}


def forward_flops(index: GraphIndex, regions, batch_size: int | None) -> int | None:
    """FLOPs of the step's forward pass (what one full recomputation would cost again);
    None when it holds loops or function calls, whose cost op_flops cannot count."""
    if any(index.ops[i] in _OPAQUE for i in regions.forward):
        return None
    return sum(op_flops(index, i, batch_size) for i in regions.forward)


def copied_flops(index: GraphIndex, batch_size: int | None) -> int:
    """Extra forward FLOPs of a rewritten graph: those of its recompute copies."""
    return sum(op_flops(index, i, batch_size) for i in range(len(index))
               if is_copy(index.names[i]))


_CONV_GRADIENTS = {"Conv2DBackpropFilter", "Conv2DBackpropInput"}
# ops that read only a part of their first input (a slice of it), or write into its buffer
# where their update lands: they move their output's or their update's bytes, not the
# whole input's (the in-place weight-decay terms, passes/in_place_terms.py, add a large
# variable's term into its gradient in pieces, each a Slice and an InplaceAdd)
_PART_READERS = frozenset({"Slice", "StridedSlice", "Gather", "GatherV2", "ResourceGather"})
_IN_PLACE_UPDATES = frozenset({"InplaceAdd", "InplaceSub", "InplaceUpdate",
                               "TensorScatterAdd", "TensorScatterUpdate",
                               "TensorScatterSub"})
# bytes an op reads or writes count as this many operations: CPU kernels do several
# floating-point operations in the time they move one byte, and the ops between the
# matmuls and convolutions (batch norm, activations, their gradients) are bound by memory
BYTE_COST = 4


def op_times(index: GraphIndex, nodes, batch_size: int | None) -> list[float]:
    """Each op's running time relative to the others' (for the order two threads run a
    step in, schedule.py): its FLOPs (a filter gradient counted as its convolution) plus
    BYTE_COST per byte it reads and writes (a slice's or an in-place update's part of its
    buffer, not the whole buffer). Ops not in `nodes` take none."""
    sizes = index.output_sizes(batch_size)
    times = [0.0] * len(index)
    data_inputs, ops = index.data_inputs, index.ops

    def read(inputs) -> int:
        return sum(sizes[s][k] or 0 for s, k in inputs if k < len(sizes[s]))

    for i in nodes:
        written = sum(b or 0 for b in sizes[i])
        if ops[i] in _IN_PLACE_UPDATES:
            # the update read, and its slice of the buffer read and written; one operation
            # per element of the update
            update = data_inputs[i][2:]
            moved = 3 * read(update)
            flops = sum(index.num_elements(t, batch_size) or 0 for t in update)
        elif ops[i] in _PART_READERS:  # its slice read and written, and the indices read
            moved = 2 * written + read(data_inputs[i][1:])
            flops = op_flops(index, i, batch_size)
        else:
            moved = written + read(data_inputs[i])
            flops = op_flops(index, i, batch_size)
        if ops[i] in _CONV_GRADIENTS and len(data_inputs[i]) == 3:
            # the convolution's multiply-adds: per element of the incoming gradient, the
            # filter's height x width x input channels
            grad = index.num_elements(data_inputs[i][2], batch_size) or 0
            f = index.shape((i, 0) if ops[i] == "Conv2DBackpropFilter" else data_inputs[i][1])
            flops = 2 * grad * prod(f[:-1]) if f and len(f) == 4 and all(
                d > 0 for d in f) else grad
        times[i] = float(flops + BYTE_COST * moved)
    return times
