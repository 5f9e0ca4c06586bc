"""Split the optimizer's gradient `IdentityN` into one `Identity` per gradient.

Keras optimizers (TF2, Keras 3) pass every gradient of a step through one `IdentityN`
(`adam/IdentityN`, `sgd/IdentityN`, ...) before the update ops read them. An `IdentityN` runs
only when all its inputs exist, so no update can start before the *last* gradient of the step
is computed, and every weight gradient stays alive until then: early updates cannot help.

The split appends one `Identity` per used output (named `<IdentityN>/graphmem_split_<k>`),
reading the `IdentityN`'s k-th input, and points the readers of output k at it. Values are
unchanged (both ops forward their input buffer); only the barrier goes. The `IdentityN` is
left in place without readers: TensorFlow prunes it (a function body keeps only what its
results, control results and stateful ops need; a session only what is fetched), and the
estimator leaves it out of the step likewise (`Regions.step_nodes`). Nodes are only appended
and inputs edited, as re-indexing expects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions
from graphmem.graph.builders import identity_node
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import input_string, parse_input
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

SPLIT_SUFFIX = "graphmem_split_"


@dataclass
class SplitPlan(PassPlan):
    split: list[str] = field(default_factory=list)  # names of the IdentityN ops split
    identities: int = 0  # Identity ops added

    @property
    def changed(self) -> bool:
        return bool(self.split)


def gradient_barriers(index: GraphIndex, regions: Regions) -> list[int]:
    """`IdentityN` ops that join several gradients before the optimizer: in the backward
    region, every input from it, no reader in the forward pass, outside loops."""
    out = []
    for i, op in enumerate(index.ops):
        if op != "IdentityN" or i not in regions.backward or index.in_loop(i):
            continue
        sources = {s for s, _ in index.data_inputs[i]}
        if len(sources) < 2 or not sources <= regions.backward:
            continue
        readers = set(index.data_consumers(i))
        if not readers or readers & regions.forward:
            continue
        out.append(i)
    return out


def split_gradient_identityn(index: GraphIndex, regions: Regions) -> SplitPlan:
    """Edit `index.graph_def` in place (the caller re-indexes)."""
    plan = SplitPlan()
    g = index.graph_def
    new_nodes = []
    for i in gradient_barriers(index, regions):
        node = g.node[i]
        name = index.names[i]
        types = list(node.attr["T"].list.type)
        shapes = list(node.attr["_output_shapes"].list.shape) \
            if "_output_shapes" in node.attr else []
        data_inputs = [text for text in node.input if not text.startswith("^")]
        controls = [text for text in node.input if text.startswith("^")]
        replacement: dict[int, str] = {}
        for k in range(index.num_outputs[i]):
            if not index.consumers.get((i, k)) or k >= len(data_inputs):
                continue
            # the IdentityN's control inputs hold each part
            ident = identity_node(f"{name}/{SPLIT_SUFFIX}{k}", [data_inputs[k], *controls],
                                  node.device, types[k] if k < len(types) else None,
                                  shapes[k] if k < len(shapes) else None)
            new_nodes.append(ident)
            replacement[k] = ident.name
        for r in sorted(set(index.data_consumers(i))):
            reader = g.node[r]
            for slot, text in enumerate(reader.input):
                src, k, control = parse_input(text)
                if not control and src == name and k in replacement:
                    reader.input[slot] = input_string(replacement[k], 0)
        plan.split.append(name)
        plan.identities += len(replacement)
    g.node.extend(new_nodes)
    return plan


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class SplitIdentityNPass(Pass):
    """A Keras optimizer's IdentityN over all gradients would hold every update back until
    the last gradient exists: one Identity per gradient instead (before early updates)."""

    name, edits = "split IdentityN", Edits.NODES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> SplitPlan:
        return split_gradient_identityn(context.index, context.regions)
