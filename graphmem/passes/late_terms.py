"""Late gradient terms: compute a gradient term that is ready at the start of the backward
pass (weight decay) just before the term it is added to.

Why: a regularizer's gradient (`L2Loss_grad/mul` = seed * w, Keras' `2 * l2 * w`) reads only
the variable and a scalar from the loss, so TF's executor computes every one of them as soon
as the backward pass starts, and each weight-sized result then waits in its `AddN` until the
layer's own gradient arrives at the far end of the chain: a second copy of the weights stays
alive across the whole backward pass (about 90 MiB at the peak of tf-slim's ResNet-50). A
control edge from the producer of the join's other term makes the early term wait until it
is needed; the update that reads the sum is not delayed by more than one cheap op.

A term is deferred only when the chain of backward ops that makes it is private to the join
(its ops feed nothing else by data; by control, only constants, which TF2 function bodies
make wait for their neighbours) and everything the chain reads from outside is cheap to hold
a little longer (variables, constants, or tensors at most 1/16 of the term's size, such as the
scalar from the loss). The trigger produces another input of the join, so it is an ancestor
of the join; the edges of all joins together are checked for cycles (one Kahn pass) and a
join whose edges would close one keeps its order. Only the order changes, never a value.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.regions import Regions, is_parameter_read
from graphmem.graph.index import SHAPE_ONLY_OPS, SUM_OPS, GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, add_edge_groups

MIN_BYTES = 4096  # smaller terms are not worth an edge
MAX_CHAIN = 8  # ops in a deferred chain: decay terms are one to three element-wise ops
CHEAP_FRACTION = 16  # an outside input up to term / 16 bytes may be held longer


@dataclass
class LateTermsPlan(PassPlan):
    terms: int = 0  # terms made to wait for the term they join
    bytes: int = 0  # their sizes, summed: what no longer waits through the backward pass

    @property
    def changed(self) -> bool:
        return self.terms > 0


def apply_late_terms(index: GraphIndex, regions: Regions,
                     batch_size: int | None) -> LateTermsPlan:
    """Add the control edges to index.graph_def and to the index (no re-index needed)."""
    plan = LateTermsPlan()
    sizes = index.output_bytes(batch_size)
    backward = regions.backward
    edges: dict[int, list[tuple[int, int]]] = {}  # join -> its edges
    deferred: dict[int, list[int]] = {}  # join -> bytes of each term it defers
    step = regions.step_nodes(index)  # without the joins in_place_terms.py replaced
    for j in index.topo:
        if j not in backward or index.ops[j] not in SUM_OPS or j not in step or \
                not _always_runs(index, j):
            continue
        inputs = index.data_inputs[j]
        if len(inputs) < 2:
            continue
        chains = [_private_chain(index, backward, sizes, s, k, j) for s, k in inputs]
        late = [s for (s, _), chain in zip(inputs, chains, strict=True) if chain is None]
        if not late:
            continue  # every term is early: there is nothing later to wait for
        trigger = max(late, key=index.position.__getitem__)
        if trigger not in backward or not _always_runs(index, trigger):
            continue
        for (s, k), chain in zip(inputs, chains, strict=True):
            if chain is None:
                continue
            roots = [q for q in chain if not any(p in chain for p, _ in index.data_inputs[q])]
            new = [(trigger, r) for r in roots if trigger not in index.control_inputs[r]]
            if new:
                edges.setdefault(j, []).extend(new)
                deferred.setdefault(j, []).append(sizes(s)[k] or 0)
    add_edge_groups(index, edges)
    plan.terms = sum(len(deferred[j]) for j in edges)
    plan.bytes = sum(sum(deferred[j]) for j in edges)
    return plan


def _always_runs(index: GraphIndex, i: int) -> bool:
    return not index.in_loop(i) and not index.may_be_dead(i) and not index.is_control_flow(i)


def _private_chain(index: GraphIndex, backward: set[int], sizes, s: int, k: int,
                   join: int) -> set[int] | None:
    """The backward ops that make input (s, k) of `join` for it alone, when they are worth
    deferring and cheap to defer; None otherwise (the term is late, or not ours to move)."""
    term = sizes(s)[k]
    if term is None or term < MIN_BYTES or not _movable(index, backward, s, {join}):
        return None
    chain = {s}
    stack = [s]
    while stack:
        q = stack.pop()
        for p, pk in index.data_inputs[q]:
            if p in chain:
                continue
            if len(chain) < MAX_CHAIN and index.ops[p] not in SHAPE_ONLY_OPS and \
                    _movable(index, backward, p, chain):
                chain.add(p)
                stack.append(p)
            elif not _cheap(index, sizes, p, pk, term):
                return None  # deferring would hold something big for longer
    return chain


def _movable(index: GraphIndex, backward: set[int], q: int, readers: set[int]) -> bool:
    """q is a plain backward op whose outputs only `readers` read, and no op but a constant
    waits for."""
    return (q in backward and not index.stateful[q] and _always_runs(index, q)
            and all(index.ops[c] == "Const" for c in index.control_consumers[q])
            and all(c in readers for c in index.data_consumers(q)))


def _cheap(index: GraphIndex, sizes, p: int, k: int, term: int) -> bool:
    if is_parameter_read(index, p):
        return True
    b = sizes(p)[k] if k < len(sizes(p)) else None
    return b is not None and b * CHEAP_FRACTION <= term


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LateTermsPass(Pass):
    """Weight-decay terms wait for the gradient they join (before early updates)."""

    name, edits = "late terms", Edits.CONTROL_EDGES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> LateTermsPlan:
        return apply_late_terms(context.index, context.regions, context.options.batch_size)
