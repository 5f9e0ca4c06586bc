"""In-place decay terms: add a large weight-decay term into its gradient piece by piece.

A weight-decay join (analysis/decay_terms.py) sums a layer's gradient `g` and a term
`scale * w` made from the weight alone; TensorFlow computes the whole term, then the sum,
so two weight-sized tensors are live at once (2 x 392 MiB for tf-slim VGG-16's fc6, the
floor of that network's peak at small batches). The pass computes the same sum as

    g2 = Reshape(g, [P, n / P]);  w2 = Reshape(w, [P, n / P])
    for p in 0..P-1:  g2 = InplaceAdd(g2, [p], Mul(Slice(w2, [p, 0], [1, n / P]), scale))
    result = Reshape(g2, shape of g)

and points the join's readers at `result`. `InplaceAdd` adds into its first input's buffer,
whoever else holds it: the analysis admits a join only when the gradient's buffer is its
alone (decay_terms.py: made by a kernel that allocates it, passed on through single-reader
Identity and Reshape ops, with no twin Grappler could merge it with). So the gradient's
own buffer receives the sum and only one piece of the term is live at a time; each piece
waits for the add before it. (`TensorScatterAdd` would be the safe choice, but TF's kernel
tries to take over its *updates* input, not the tensor added into, and so copies the whole
gradient for every piece.) Every element is `g + scale * w` as before: the same `Mul`
(operands in the same order) and one float addition, which is commutative. The join and
its term are left without readers; TensorFlow prunes them (a
session runs what is fetched, a function body what its results need), and so does the
estimate (`Regions.step_nodes`). Nodes are only appended and inputs edited.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.decay_terms import DecayJoin, decay_joins
from graphmem.graph import dtypes
from graphmem.graph.builders import add_int32_const, add_op, redirect_readers, unique_name
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import input_string
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

SCOPE = "graphmem_in_place"


@dataclass
class InPlaceTermsPlan(PassPlan):
    terms: list[str] = field(default_factory=list)  # the joins rewritten
    pieces: int = 0  # pieces the terms are computed in, summed
    bytes: int = 0  # the terms' sizes, summed: no longer allocated beside their gradient

    @property
    def changed(self) -> bool:
        return bool(self.terms)


def add_terms_in_place(index: GraphIndex, joins: list[DecayJoin]) -> InPlaceTermsPlan:
    """Edit `index.graph_def` in place for each join (the caller re-indexes)."""
    plan = InPlaceTermsPlan()
    g = index.graph_def
    taken = set(index.id_of)
    replaced: dict[str, str] = {}  # join name -> the name of its result
    for d in joins:
        name = index.names[d.join]
        base = unique_name(f"{name}/{SCOPE}", taken.__contains__)
        taken.add(base)
        replaced[name] = _build(g, index, d, base)
        plan.terms.append(name)
        plan.pieces += d.pieces
        plan.bytes += d.bytes
    if not replaced:
        return plan
    redirect_readers(index, (d.join for d in joins), replaced)
    return plan


def _build(g, index: GraphIndex, d: DecayJoin, base: str) -> str:
    """Append the pieces of one join; returns the name of the op holding its result."""
    device = index.devices[d.join]
    t = {"T": d.dtype}
    n = d.bytes // (dtypes.itemsize(d.dtype) or 1)
    width = n // d.pieces
    flat = [d.pieces, width]
    add_int32_const(g, f"{base}/flat_shape", flat, [2], device)
    add_int32_const(g, f"{base}/shape", list(d.shape), [len(d.shape)], device)
    add_int32_const(g, f"{base}/piece_size", [1, width], [2], device)
    reshape = {**t, "Tshape": dtypes.INT32}
    add_op(g, f"{base}/weight", "Reshape",
           [input_string(index.names[d.weight[0]], d.weight[1]), f"{base}/flat_shape"],
           device, reshape, flat)
    acc = f"{base}/gradient"
    waits = ["^" + index.names[c] for c in index.control_inputs[d.join]]  # the join's
    add_op(g, acc, "Reshape",
           [input_string(index.names[d.gradient[0]], d.gradient[1]), f"{base}/flat_shape",
            *waits], device, reshape, flat)
    scalar = input_string(index.names[d.scalar[0]], d.scalar[1])
    for p in range(d.pieces):
        at = f"{base}/piece_{p}"
        add_int32_const(g, f"{at}/begin", [p, 0], [2], device)
        add_int32_const(g, f"{at}/row", [p], [1], device)
        # waits for the add before it (or for the gradient): one piece live at a time
        add_op(g, f"{at}/weight", "Slice",
               [f"{base}/weight", f"{at}/begin", f"{base}/piece_size", "^" + acc], device,
               {**t, "Index": dtypes.INT32}, [1, width])
        operands = [f"{at}/weight", scalar] if d.weight_first else [scalar, f"{at}/weight"]
        add_op(g, f"{at}/term", "Mul", operands, device, t, [1, width])
        add_op(g, f"{at}/sum", "InplaceAdd", [acc, f"{at}/row", f"{at}/term"], device, t,
               flat)
        acc = f"{at}/sum"
    add_op(g, f"{base}/result", "Reshape", [acc, f"{base}/shape"], device, reshape,
           list(d.shape))
    return f"{base}/result"


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class InPlaceTermsPass(Pass):
    """A weight-decay term as large as its weight is added into the gradient's buffer in
    pieces, instead of beside it (with early updates: both act on the optimizer's side)."""

    name, edits = "in-place terms", Edits.NODES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> InPlaceTermsPlan:
        return add_terms_in_place(context.index, decay_joins(context.index, context.regions))
