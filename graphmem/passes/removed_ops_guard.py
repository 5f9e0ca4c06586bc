"""Removed-ops guard: the passes' ordering edges are moved off the ops Grappler removes.

Grappler folds ops whose result equals an input (a broadcasting op's gradient `Sum` over
axes that turn out empty, the `Reshape` back to the shape the value has, an `Identity`)
and its dependency optimizer then takes them out (a `Shape` it folds into a constant of
the same name, which keeps its edges: those stay), but not an op that carries a control
edge (analysis/removable_ops.py). An ordering edge of ours on such an op keeps it, and
what Grappler makes of the ops around it changes: on Keras ConvNeXtSmall an early
update's edge to a layer norm's gradient `Reshape` kept it between the gradient's product
and its `RsqrtGrad`, and the products Grappler regroups through it (which the original's
gradient got) were rebuilt otherwise, rounding differently (loss 4.8e-7 apart at batch 4
with Grappler on; bit for bit alike with it off). The recompute pass never holds a segment
back by such an op; the schedule passes order the backward pass op by op and do not look.

Each edge of ours into such an op of the original graph goes to the ops that read it
(through others of its kind): what waited for the edge's source still waits, as the op's
readers did through it. Each edge of ours out of such an op leaves from the op whose value
it passes on instead (through others of its kind), and from the ops the op itself waits
for: what waited for the op waits for all it did. The swap pass's edges stay (its
triggers are chosen op by op). Neither can close a cycle the edge did not: a reader of
the op comes after it, the op's input before it. An edge that would join an op to itself
is dropped; dropping an ordering edge changes no value.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.pruning import kept_by_grappler
from graphmem.analysis.removable_ops import may_be_removed
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, add_edge_groups, remove_edges

MAX_CHAIN = 16  # removable ops passed on the way to a reader or a source


@dataclass
class RemovedOpsGuardPlan(PassPlan):
    edges_moved: int = 0  # edges of ours now on the ops a removed op forwards to or from
    edges_dropped: int = 0  # edges that had nowhere to go

    @property
    def changed(self) -> bool:
        return self.edges_moved > 0 or self.edges_dropped > 0


def apply_removed_ops_guard(index: GraphIndex, original: GraphIndex) -> RemovedOpsGuardPlan:
    """Move the control edges the passes added on ops of `original` (the graph before the
    passes; theirs append nodes, so its ids hold) that Grappler may remove."""
    size = len(original)
    plan = RemovedOpsGuardPlan()

    def ours(u: int, v: int) -> bool:
        return u >= size or v >= size or u not in original.control_inputs[v]

    def removed(i: int) -> bool:
        # a shape op is not removed but folded into a constant of its name, which keeps
        # its control edges: an edge on it orders what it did
        return i < size and original.ops[i] not in SHAPE_ONLY_OPS and \
            may_be_removed(original, i)

    remove: set[tuple[int, int]] = set()
    moves: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r in range(size):
        if not index.control_inputs[r] and not index.control_consumers[r]:
            continue
        if not removed(r):
            continue
        for u in index.control_inputs[r]:
            if ours(u, r) and not kept_by_grappler(index, u):  # swap triggers stay
                remove.add((u, r))
                moves[(u, r)] = [(u, c) for c in _readers(index, r, removed) if c != u]
        for v in index.control_consumers[r]:
            if ours(r, v) and not kept_by_grappler(index, v):
                remove.add((r, v))
                # what the op waited for, its readers wait for once Grappler removes it
                sources = [*_sources(index, r, removed), *index.control_inputs[r]]
                moves[(r, v)] = [(s, v) for s in dict.fromkeys(sources) if s != v]
    if not remove:
        return plan
    remove_edges(index, sorted(remove))
    for key, edges in list(moves.items()):
        edges = [(u, v) for u, v in dict.fromkeys(edges)
                 if u not in index.control_inputs[v] and (u, v) not in remove]
        if edges:
            moves[key] = edges
        else:
            del moves[key]
    add_edge_groups(index, moves)  # less the groups that would close a cycle
    plan.edges_moved = len(moves)
    plan.edges_dropped = len(remove) - plan.edges_moved
    return plan


def _readers(index: GraphIndex, r: int, removed) -> list[int]:
    """The ops that read op r's value, looking past the ones Grappler removes too."""
    found, todo, seen = [], [r], {r}
    for _ in range(MAX_CHAIN):
        if not todo:
            break
        nxt = []
        for i in todo:
            for c in index.data_consumers(i):
                if c in seen:
                    continue
                seen.add(c)
                (nxt if removed(c) else found).append(c)
        todo = nxt
    return found + todo  # past the limit: the removable ops reached stand in


def _sources(index: GraphIndex, r: int, removed) -> list[int]:
    """The ops whose value op r passes on (its first input; an `IdentityN` all of its own),
    looking past the ones Grappler removes too; shape ops pass on their input's shape."""
    i = r
    for _ in range(MAX_CHAIN):
        inputs = index.data_inputs[i]
        if not inputs:
            return []
        values = [s for s, _ in inputs] if index.ops[i] == "IdentityN" else [inputs[0][0]]
        if len(values) != 1 or not removed(values[0]):
            return values
        i = values[0]
    return [i]


class RemovedOpsGuardPass(Pass):
    """Ordering edges are kept off the ops Grappler removes."""

    name, edits = "removed ops guard", Edits.CONTROL_EDGES

    def applies(self, context: PassContext) -> bool:
        return any(p.changed for p in context.plans.values())

    def run(self, context: PassContext) -> RemovedOpsGuardPlan:
        return apply_removed_ops_guard(context.index, context.given_index)

