"""Ops TensorFlow merges into one kernel after graphmem has written the graph.

Why it matters: when a session starts, Grappler's remapper and the oneDNN layout pass merge
some groups of ops into one (a convolution's filter gradient and its bias gradient, which
read the same incoming gradient, become `_MklNativeConv2DBackpropFilterWithBias`; a
convolution, its bias and its activation become `_FusedConv2D`). Merging two ops that the
graph keeps apart is safe only while neither reaches the other through a third op: on
tf-slim's ResNet-50 v2 a bias update moved early (early updates) held back a gradient op
that released a recompute segment, whose copy the shortcut's filter gradient read; merged
with the bias gradient, that made a cycle. TF neither refuses such a graph nor reports
it: the executor silently skipped the ~600 ops on or after the cycle, and training stopped
updating most variables (with Grappler off, as `verify --exact` runs, nothing was merged
and the same graph trained bit for bit).

So the rewrite is checked for paths between the two ops of every such pair
(passes/fusion_guard.py). The pairs here are a superset of what TF merges (it checks more
conditions: device, dtype, data format): checking a pair TF does not merge only makes the
check stricter. Cost: one pass over the nodes and their inputs.
"""

from __future__ import annotations

from graphmem.analysis.broadcast_grads import folded_readers, folded_shape_ops
from graphmem.graph.index import GraphIndex, Tensor

# ops looked through above a gradient: TF1's `tuple/control_dependency` Identity, and what
# Grappler removes before TF merges ops (`_forwarders`)
MAX_IDENTITIES = 16
BIAS_GRADIENTS = frozenset({"BiasAddGrad", "BiasAddGradV1"})
# ops whose result is a weight gradient that TF computes together with the bias gradient
# of the same incoming gradient (oneDNN's filter gradient with bias). A dense layer's
# weight gradient (MatMul, x^T dy) is not merged with its bias gradient by TF 2.21 (seen
# in the graph a session runs: `_MklMatMul` beside `BiasAddGrad`), so it is not listed:
# each pair listed costs the rewrite the edges on paths between its ops
FILTER_GRADIENTS = frozenset({"Conv2DBackpropFilter", "Conv3DBackpropFilter",
                              "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropFilter"})
# contractions the remapper merges with their `BiasAdd`, and the activations it merges
# after them (merged_reader)
CONTRACTIONS = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "MatMul"})
FUSED_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid"})
# producer op -> reader ops merged into it when the reader reads the producer's first output
# (the remapper's contraction, batch-norm and pad patterns)
CHAINS: dict[str, frozenset[str]] = {
    "Conv2D": frozenset({"BiasAdd", "FusedBatchNorm", "FusedBatchNormV3", "Squeeze"}),
    "Conv3D": frozenset({"BiasAdd", "FusedBatchNorm", "FusedBatchNormV3"}),
    "DepthwiseConv2dNative": frozenset({"BiasAdd", "FusedBatchNorm", "FusedBatchNormV3"}),
    "MatMul": frozenset({"BiasAdd"}),
    "BatchMatMulV2": frozenset({"Mul", "AddV2", "Add"}),
    "Pad": frozenset({"Conv2D", "Conv3D"}),
    "Squeeze": frozenset({"BiasAdd"}),
    "BiasAdd": frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Add",
                          "AddV2", "Mul"}),
    "FusedBatchNorm": frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Add", "AddV2"}),
    "FusedBatchNormV3": frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Add", "AddV2"}),
    "Add": frozenset({"Relu", "Relu6", "Elu", "LeakyRelu"}),
    "AddV2": frozenset({"Relu", "Relu6", "Elu", "LeakyRelu"}),
}


def fused_pairs(index: GraphIndex, batch_size: int | None = None) -> list[tuple[int, int]]:
    """Pairs of ops TF may run as one kernel: a bias gradient and a weight gradient that
    read the same tensor once Grappler has simplified the graph, and a producer and its
    reader in one of the CHAINS patterns."""
    ops, data_inputs = index.ops, index.data_inputs
    pairs: list[tuple[int, int]] = []
    readers_of: dict[tuple[int, int], list[int]] | None = None
    through: set[int] = set()
    for b in range(len(ops)):
        op = ops[b]
        if op in BIAS_GRADIENTS and data_inputs[b]:
            if readers_of is None:
                through = _forwarders(index, batch_size)
                readers_of = _weight_gradient_readers(index, through)
            pairs.extend((f, b) for f in readers_of.get(index.under_identities(
                data_inputs[b][0], through, MAX_IDENTITIES), ()))
        for s, k in data_inputs[b]:
            # TF merges a producer into its reader only when nothing else reads it
            if k == 0 and op in CHAINS.get(ops[s], ()) and _one_reader(index, s):
                pairs.append((s, b))
    return pairs


def in_merged_chain(index: GraphIndex, s: int) -> bool:
    """Whether op s is the producer or the reader of a CHAINS pair: TF may run the pair as
    one kernel, which Grappler's remapper does only while neither has control edges."""
    readers = index.consumers.get((s, 0), ())
    if len(readers) == 1 and index.ops[readers[0]] in CHAINS.get(index.ops[s], ()):
        return True
    return any(k == 0 and index.ops[s] in CHAINS.get(index.ops[p], ()) and
               _one_reader(index, p) for p, k in index.data_inputs[s])


def merged_reader(index: GraphIndex, t: Tensor) -> Tensor | None:
    """The result of the op TF merges tensor t's op with, when t's op is a contraction
    read only by its `BiasAdd`, or a contraction's `BiasAdd` read only by its activation;
    else None. Narrower than CHAINS (a superset, enough for the fusion guard's cycle check):
    these are the pairs the remapper certainly merges, so a checkpoint may move along them
    (passes/recompute.py)."""
    readers = index.consumers.get(t, ())
    if t[1] != 0 or len(readers) != 1:
        return None
    r, op = readers[0], index.ops[t[0]]
    if op in CONTRACTIONS and index.ops[r] == "BiasAdd":
        return r, 0
    if op == "BiasAdd" and index.ops[r] in FUSED_ACTIVATIONS and index.data_inputs[t[0]]:
        c = index.data_inputs[t[0]][0]
        if index.ops[c[0]] in CONTRACTIONS and _one_reader(index, c[0]) and c[1] == 0:
            return r, 0
    return None


def merged_with_relu(index: GraphIndex, f: int) -> bool:
    """Whether the remapper merges op f (a training batch norm) with its `Relu` into one
    kernel (`_FusedBatchNormEx`): the relu is the one reader of f's output 0 and neither
    has control edges (onednn_workspaces.py: the merged kernel keeps the relu's mask)."""
    node = index.node(f)
    if "is_training" in node.attr and not node.attr["is_training"].b:
        return False
    if not _one_reader(index, f):
        return False
    r = index.consumers[(f, 0)][0]
    return index.ops[r] == "Relu" and not (
        index.control_inputs[f] or index.control_consumers[f]
        or index.control_inputs[r] or index.control_consumers[r])


def _one_reader(index: GraphIndex, s: int) -> bool:
    return len(index.consumers.get((s, 0), ())) == 1


def _forwarders(index: GraphIndex, batch_size: int | None) -> set[int]:
    """Ops Grappler turns into an Identity of their first input and then removes: the
    reductions and reshapes of a broadcasting op's gradient when nothing broadcasts (a
    residual add's gradient reaches both branches through them)."""
    nodes = set(range(len(index)))
    return folded_readers(index, nodes, folded_shape_ops(index, nodes, batch_size))


def _weight_gradient_readers(index: GraphIndex, through: set[int]
                             ) -> dict[tuple[int, int], list[int]]:
    """tensor -> the FILTER_GRADIENTS ops reading it (one pass over the graph)."""
    out: dict[tuple[int, int], list[int]] = {}
    ops = index.ops
    for f, inputs in enumerate(index.data_inputs):
        if ops[f] not in FILTER_GRADIENTS:
            continue
        for t in inputs:
            out.setdefault(index.under_identities(t, through, MAX_IDENTITIES), []).append(f)
    return out
