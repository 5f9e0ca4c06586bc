"""Split the optimizer's gradient `IdentityN` into one `Identity` per gradient.

Keras optimizers (TF2, Keras 3) pass every gradient of a step through one `IdentityN`
(`adam/IdentityN`, `sgd/IdentityN`, ...) before the update ops read them. In the graph as
written, an `IdentityN` runs only when all its inputs exist, so no update can start before
the *last* gradient of the step is computed: early updates cannot order anything before it.

The split (graph/identityn.py) appends one `Identity` per used output (named
`<IdentityN>/graphmem_split_<k>`), reading the `IdentityN`'s k-th input, and points the
readers of output k at it. Values are unchanged (both ops forward their input buffer); only
the barrier goes. The `IdentityN` is left in place without readers: TensorFlow prunes it (a
function body keeps only what its results, control results and stateful ops need; a session
only what is fetched), and the estimator leaves it out of the step likewise
(`Regions.step_nodes`).

Grappler's dependency optimizer bypasses most such `IdentityN` ops itself before a step
runs (analysis/identity_bypass.py), so that TF's own order has no barrier either. The split
still matters: the passes after it (early updates) order the updates by the graph they see,
and an `IdentityN` with control inputs, or read twice by one op, stays in TF's graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions
from graphmem.graph.identityn import SPLIT_SUFFIX, split_identityn
from graphmem.graph.index import GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

__all__ = ["SPLIT_SUFFIX", "SplitIdentityNPass", "gradient_barriers", "split_gradient_identityn"]


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
    barriers = gradient_barriers(index, regions)
    added = split_identityn(index.graph_def, index, barriers)
    return SplitPlan(split=[index.names[i] for i in barriers], identities=added)


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class SplitIdentityNPass(Pass):
    """A Keras optimizer's IdentityN over all gradients would hold every update back until
    the last gradient exists: one Identity per gradient instead (before early updates)."""

    name, edits = "split IdentityN", Edits.NODES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> SplitPlan:
        return split_gradient_identityn(context.index, context.regions)
