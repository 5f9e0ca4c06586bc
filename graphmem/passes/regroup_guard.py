"""Regroup guard: keep the rewrite's ordering edges off the sums and products Grappler
regroups, so that TF computes them as it computes the original's.

Grappler rebuilds some trees of `Mul` or `Add`/`AddN` ops in another order, which rounds
differently, and leaves alone a tree with a control edge on one of its ops
(analysis/arithmetic_groups.py). The schedule passes add ordering edges to backward ops;
one on such a tree would make TF round the rewritten graph differently from the original,
and training would drift from it by float rounding (Keras MobileNetV2: from step 55).
For each tree of the original graph that Grappler may rebuild, an edge of ours on one of
its ops (the inner ops, the Identity-like ops between them, and a sum's root) is

- moved, when it leaves one, to the op the tree's result leaves from: a product's root,
  which may have control edges, or the one reader of a sum's root. What waited for the
  op now waits for a later one: the order it kept still holds;
- dropped, when it enters one, or leaves one and cannot be moved (the tree's result has
  several readers, or the move would close a cycle): it only ordered ops for memory;
- kept only when it leaves one into a write that cannot be moved: it keeps the write
  after a read (the plan counts these trees as changed).

Removing or delaying an ordering edge never changes a value; the edges an op of a tree
never carries (the tree was free of them in the original) are all the rewrite's.
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from graphmem.analysis.arithmetic_groups import (
    ADD,
    MUL,
    RegroupedTree,
    dead_ops,
    reader_through_forwarders,
    regrouped_trees,
)
from graphmem.analysis.regions import is_state_write
from graphmem.graph.index import GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, add_edge_groups, remove_edges


@dataclass
class RegroupGuardPlan(PassPlan):
    trees: int = 0  # trees of the original graph that Grappler may rebuild
    edges_moved: int = 0  # ordering edges moved to the op the tree's result leaves from
    edges_dropped: int = 0  # ordering edges into (or from) a tree's ops that were removed
    trees_changed: int = 0  # trees still not as the original's: Grappler may round them
    # differently (an edge into a write kept, or a reader added by a pass)

    @property
    def changed(self) -> bool:
        return self.edges_moved > 0 or self.edges_dropped > 0


def apply_regroup_guard(index: GraphIndex, original: GraphIndex) -> RegroupGuardPlan:
    """Move or remove the rewrite's control edges on the regrouped trees of `original`
    (the index of the graph before the passes: theirs append nodes, so its ids hold) in
    index.graph_def and the index."""
    trees = regrouped_trees(original)
    plan = RegroupGuardPlan(trees=len(trees))
    size = len(original)

    def ours(u: int, v: int) -> bool:
        return u >= size or v >= size or u not in original.control_inputs[v]

    remove: set[tuple[int, int]] = set()
    moves: dict[tuple[int, int], list[tuple[int, int]]] = {}
    into_writes: dict[tuple[int, int], int] = {}  # edge from a tree's op into a write -> tree
    changed: set[int] = set()
    dead = dead_ops(index)
    for k, tree in enumerate(trees):
        guarded = _tree_ops(index, tree, dead)
        if guarded is None:  # a pass gave an op of the tree another reader
            changed.add(k)
            continue
        target = tree.root if tree.family == MUL else _single_reader(index, tree.root, dead)
        if target is not None and target in guarded:
            target = None
        for x in guarded:
            remove.update((u, x) for u in index.control_inputs[x] if ours(u, x))
            for v in index.control_consumers[x]:
                if not ours(x, v) or (x, v) in remove:
                    continue
                remove.add((x, v))
                if target is not None and target != v and target not in index.control_inputs[v]:
                    moves[(x, v)] = [(target, v)]
                if is_state_write(index.ops[v]):
                    into_writes[(x, v)] = k
    remove_edges(index, sorted(remove))
    moved = add_edge_groups(index, moves)  # less the moves that would close a cycle
    # an edge into a write that could not move keeps the write after a read: it goes back
    # where it was (it was in the graph: it closes no cycle)
    stuck = [edge for edge in into_writes if edge not in moves]
    add_edge_groups(index, {edge: [edge] for edge in stuck})
    changed.update(into_writes[edge] for edge in stuck)
    plan.edges_moved = len(moved)
    plan.edges_dropped = len(remove) - len(moved) - len(stuck)
    plan.trees_changed = len(changed)
    return plan


def _tree_ops(index: GraphIndex, tree: RegroupedTree, dead: Set[int]) -> set[int] | None:
    """The ops of the tree in the rewritten graph that must stay free of control edges:
    its inner ops, the forwarders between them (a pass may have added some, as the split
    of an optimizer's IdentityN does), and a sum's root. None when an inner op no longer
    reaches its reader through forwarders alone."""
    ops = set(tree.members)
    if tree.family == ADD:
        ops.add(tree.root)
    for m in tree.members:
        found = reader_through_forwarders(index, (m, 0), free=False, dead=dead)
        if found is None or found[0] not in tree.members and found[0] != tree.root:
            return None
        ops.update(found[2])
    return ops


def _single_reader(index: GraphIndex, i: int, dead: Set[int]) -> int | None:
    """The one op that reads op i's result, through forwarders; None when not one."""
    found = reader_through_forwarders(index, (i, 0), free=False, dead=dead)
    return None if found is None else found[0]


class RegroupGuardPass(Pass):
    """Ordering edges are kept off the sums and products Grappler regroups."""

    name, edits = "regroup guard", Edits.CONTROL_EDGES

    def applies(self, context: PassContext) -> bool:
        return any(p.changed for p in context.plans.values())

    def run(self, context: PassContext) -> RegroupGuardPlan:
        return apply_regroup_guard(context.index, context.given_index)
