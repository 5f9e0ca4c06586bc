"""Fusion guard: no cycle once TensorFlow merges ops into one kernel (the last pass).

The passes before add control edges that only order ops (a recompute segment's triggers,
an early update's edges to the backward ops after it); each pass proves its edges close no
cycle in the graph as written. TF merges some groups of ops when a session starts
(analysis/kernel_fusions.py), and two ops merged while a path of ours runs from one to the
other make a cycle that TF does not report: the ops on it never run. For each pair of ops
TF may merge, this pass finds the paths between them and removes the ordering edges the
passes added on those paths: a copy then starts when its inputs are ready, an update runs
when TF gets to it. Removing an ordering edge never changes a value:
edges that keep a variable's reads and writes apart (an update waiting for the readers of
its variable, a write waiting for a copy that reads the old value) are never removed, and
neither is any edge of the original graph.

Cost: per pair, two searches over the ops between the pair's topological positions (a
convolution's filter and bias gradients sit next to each other in the backward pass).
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.kernel_fusions import fused_pairs
from graphmem.analysis.regions import Regions, is_state_write
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import is_copy, is_hold
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, remove_edges


@dataclass
class FusionGuardPlan(PassPlan):
    edges_removed: int = 0  # ordering edges that closed a cycle through merged ops
    pairs_left: int = 0  # merged pairs already ordered by the graph as written (TF keeps
    # them apart then), or by edges of ours that keep reads and writes apart

    @property
    def changed(self) -> bool:
        return self.edges_removed > 0


def apply_fusion_guard(index: GraphIndex, original: GraphIndex, original_regions: Regions,
                       batch_size: int | None = None) -> FusionGuardPlan:
    """Remove the ordering edges that close a cycle through merged ops from
    index.graph_def and from the index. `original`:
    the index of the graph before the passes (theirs append nodes, so its ids hold)."""
    plan = FusionGuardPlan()
    removed: set[tuple[int, int]] = set()
    position = index.position
    for x, y in fused_pairs(index, batch_size):
        a, b = (x, y) if position[x] < position[y] else (y, x)
        cut = _edges_between(index, a, b, original, original_regions, removed)
        if cut is None:
            plan.pairs_left += 1
        else:
            removed.update(cut)
    remove_edges(index, sorted(removed))
    plan.edges_removed = len(removed)
    return plan


def _edges_between(index: GraphIndex, a: int, b: int, original: GraphIndex,
                   regions: Regions, removed: set[tuple[int, int]]
                   ) -> set[tuple[int, int]] | None:
    """The ordering edges of ours on the paths from `a` to `b` (a before b), which merging
    the two would turn into a cycle. Paths made of the original graph's edges alone are
    TF's own (a TF1 gradient `tuple` orders a bias gradient before the identity its filter
    gradient reads; Grappler removes it before it merges them): with no control edge of
    ours on any path, nothing is removed. None when a path through a control edge of ours
    that must stay (one keeping a variable's reads and writes apart) remains. Paths are
    searched between the two ops' topological positions only; the direct edge from `a`
    to `b`, which the merge itself removes, is not followed."""
    position = index.position
    lo, hi = position[a], position[b]
    size = len(original)

    def reach(start: int, step, inside, skip: set[tuple[int, int]]) -> set[int]:
        seen = {start}
        todo = [start]
        while todo:
            i = todo.pop()
            for j, edge in step(i):
                if j not in seen and inside(j) and edge not in skip and edge != (a, b):
                    seen.add(j)
                    todo.append(j)
        return seen

    def forward(i: int):
        for j in index.data_consumers(i):
            yield j, (i, j)
        for j in index.control_consumers[i]:
            yield j, (i, j)

    def backward(i: int):
        for s, _ in index.data_inputs[i]:
            yield s, (s, i)
        for s in index.control_inputs[i]:
            yield s, (s, i)

    def ours_on_paths(skip: set[tuple[int, int]]) -> set[tuple[int, int]]:
        after_a = reach(a, forward, lambda j: position[j] <= hi, skip)
        if b not in after_a:
            return set()
        before_b = reach(b, backward, lambda j: position[j] >= lo, skip)
        return {(u, v) for v in before_b for u in index.control_inputs[v]
                if u in after_a and (u, v) not in skip
                and (v >= size or u >= size or u not in original.control_inputs[v])}

    ours = ours_on_paths(removed)
    cut = {(u, v) for u, v in ours if _ordering_only(index, u, v, original, regions)}
    if cut != ours and ours_on_paths(removed | cut):
        return None
    return cut


def _ordering_only(index: GraphIndex, u: int, v: int, original: GraphIndex,
                   regions: Regions) -> bool:
    """Whether control edge u -> v is one a pass added only to order ops for memory:
    a trigger holding back a recompute copy (a backward op of the original graph into a
    copy), or an early update's edge to a backward op after it (an update into an op that
    writes nothing). Edges among the original graph's ops that it already had, and edges
    into writes, are not."""
    size = len(original)
    if v >= size:  # a copy or a hold: its triggers are backward ops of the original graph
        return (is_copy(index.names[v]) or is_hold(index.names[v])) and u < size \
            and u in regions.backward
    if u >= size or is_state_write(index.ops[v]) or u in original.control_inputs[v]:
        return False
    return is_state_write(index.ops[u]) and v in regions.backward


class FusionGuardPass(Pass):
    """Ordering edges that would close a cycle once TF merges ops are removed."""

    name, edits = "fusion guard", Edits.CONTROL_EDGES

    def applies(self, context: PassContext) -> bool:
        return any(p.changed for p in context.plans.values())

    def run(self, context: PassContext) -> FusionGuardPlan:
        return apply_fusion_guard(context.index, context.given_index,
                                  context.original_regions, context.options.batch_size)
