"""Early updates: let each optimizer update run as soon as its gradient is ready.

TF's executor runs the backward chain depth first, so the weight-gradient updates it readies
on the way wait until the chain ends, and every weight gradient stays alive until then: for
MLPs and transformers that is often the step's peak. This pass adds a control edge from each
update to the backward ops one step further down the chain (the readers of the gradient's
siblings), so the chain cannot run ahead of the updates.

Only the order changes, never a value: an update gets an edge only when every read of its
variable is provably ordered before it (so no read can see the new value), and an edge is
only added where it provably cannot close a cycle. Both are reachability questions between
an update and a few ops near it. They are answered without per-update sets over the whole
graph (one bit per update per op grows as nodes x updates: 16 GB at a million nodes):

- an op placed after the update in topological order cannot be its ancestor;
- the rest is asked of a reachability index (graph/reachability.py): interval labels answer
  most "no"s, landmarks (the loss, the last forward ops the backward pass reads) the long
  "yes"es from forward reads, and short searches with a visit budget the rest; past the
  budget the answer is the safe one (skip the update, or drop the edge).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions, is_state_write
from graphmem.graph.index import VARIABLE_OPS, GraphIndex
from graphmem.graph.reachability import Reachability


@dataclass
class EarlyUpdatesPlan:
    updates: int = 0  # updates that got edges
    edges: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # why -> updates


def apply_early_updates(index: GraphIndex, regions: Regions,
                        checkpoints: list[int] = ()) -> EarlyUpdatesPlan:
    """Add the edges to the graph and to `index` (no re-index needed). `checkpoints`: the
    forward ops a recompute pass kept, which the rewritten backward pass reads (landmarks
    for the ordering questions)."""
    plan = EarlyUpdatesPlan()
    backward = regions.backward
    updates = [i for i in sorted(regions.optimizer, key=index.position.__getitem__)
               if is_state_write(index.ops[i]) and _gradient_input(index, i, backward)
               is not None]
    if not updates:
        return plan
    step = regions.step_nodes(index)
    chosen: dict[int, list[int]] = {}  # update -> backward ops that wait for it
    reach = Reachability(index, _landmarks(index, regions, checkpoints))
    for a in updates:
        if index.in_loop(a):
            _skip(plan, "inside a loop")
            continue
        variable = _variable_of(index, a)
        if variable is None:
            _skip(plan, "variable not found")
            continue
        reads = [r for r in _reads_of(index, variable, a) if r in step]
        ordered = [reach.reaches(r, a) for r in reads]
        if None in ordered:
            _skip(plan, "ordering not settled within the search budget")
            continue
        if not all(ordered):
            _skip(plan, "a read of the variable is not ordered before the update")
            continue
        # an edge a -> x closes a cycle when a depends on x; an op placed after a cannot
        # be its ancestor, and inside a loop body the test ignores back edges: skip those
        targets = [x for x in _next_in_chain(index, a, backward) if not index.in_loop(x)
                   and (index.position[x] > index.position[a] or reach.reaches(x, a) is False)]
        if not targets:
            _skip(plan, "no backward op after the gradient")
            continue
        chosen[a] = targets
    for a in _closing_cycles(index, chosen):
        del chosen[a]
        _skip(plan, "its edges would close a cycle with another update's")
    added = [(a, x) for a, targets in chosen.items() for x in targets]
    for a, x in added:
        index.graph_def.node[x].input.append("^" + index.names[a])
    index.add_control_edges(added)
    plan.updates = len(chosen)
    plan.edges = len(added)
    return plan


def _closing_cycles(index: GraphIndex, chosen: dict[int, list[int]]) -> list[int]:
    """Updates whose edges, each safe alone, may close a cycle together with the others'
    (a1 -> x1 -> ... -> a2 -> x2 -> ... -> a1). Edges that run along the topological order
    cannot; otherwise one Kahn pass over the graph with every chosen edge finds the ops
    left waiting, and the updates with an edge into them are dropped: every cycle runs
    through such an edge, and the graph without them is acyclic."""
    position = index.position
    if all(position[a] < position[x] for a, xs in chosen.items() for x in xs):
        return []
    n = len(index)
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        if index.ops[i] in ("Merge", "RefMerge"):
            preds = [s for s, _ in index.data_inputs[i]
                     if index.ops[s] not in ("NextIteration", "RefNextIteration")]
        else:
            preds = [s for s, _ in index.data_inputs[i]]
        preds += index.control_inputs[i]
        for s in preds:
            succ[s].append(i)
        indeg[i] = len(preds)
    for a, xs in chosen.items():
        for x in xs:
            succ[a].append(x)
            indeg[x] += 1
    stack = [i for i in range(n) if indeg[i] == 0]
    while stack:
        i = stack.pop()
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    return [a for a, xs in chosen.items() if any(indeg[x] > 0 for x in xs)]


def _landmarks(index: GraphIndex, regions: Regions, checkpoints: list[int]) -> list[int]:
    """Ops that forward reads of weights reach and that reach the updates: the last
    checkpoints a recompute pass kept (the rewritten backward pass starts from them), the
    last forward ops on the loss's path that the backward pass reads (the cross entropy, the
    logits), and the loss with its inputs. Eight at most (Reachability's limit)."""
    position = index.position.__getitem__
    loss_nodes = [t[0] for t in regions.loss]
    on_loss_path = index.ancestors(loss_nodes, data_only=True) if loss_nodes else set()
    read = sorted({s.tensor[0] for s in regions.saved if s.tensor[0] in on_loss_path},
                  key=position)
    near_loss = loss_nodes + [s for i in loss_nodes for s, _ in index.data_inputs[i]]
    found = sorted(checkpoints, key=position)[-3:] + read[-3:] + near_loss
    return list(dict.fromkeys(found))[:8]


def _gradient_input(index: GraphIndex, a: int, backward: set[int]) -> int | None:
    for s, _ in index.data_inputs[a]:
        if s in backward:
            return s
    return None


def _through_identities(index: GraphIndex, i: int, backward: set[int]) -> int:
    while index.ops[i] == "Identity" and index.data_inputs[i] \
            and index.data_inputs[i][0][0] in backward:
        i = index.data_inputs[i][0][0]
    return i


def _readers_past_identities(index: GraphIndex, i: int, backward: set[int]) -> list[int]:
    out = []
    for c in index.data_consumers(i):
        if c not in backward:
            continue
        if index.ops[c] == "Identity":
            out.extend(_readers_past_identities(index, c, backward))
        else:
            out.append(c)
    return out


def _next_in_chain(index: GraphIndex, a: int, backward: set[int]) -> list[int]:
    """Readers of the outputs of the gradient op's siblings: the ops that continue the
    backward chain past the point where the update's gradient was made."""
    core = _through_identities(index, _gradient_input(index, a, backward), backward)
    out: set[int] = set()
    for up, _ in index.data_inputs[core]:
        if up not in backward:
            continue
        for sibling in index.data_consumers(up):
            if sibling == core or sibling not in backward:
                continue
            out.update(_readers_past_identities(index, sibling, backward))
    out.discard(a)
    return sorted(out)


def _variable_of(index: GraphIndex, a: int) -> int | None:
    if not index.data_inputs[a]:
        return None
    s = index.data_inputs[a][0][0]  # updates take the variable (ref or handle) first
    return s if index.ops[s] in VARIABLE_OPS or index.ops[s] == "_Arg" else None


def _reads_of(index: GraphIndex, variable: int, a: int) -> list[int]:
    """Every op that reads the variable's value (through Identity chains), the update's
    own inputs aside."""
    reads, stack = [], list(index.data_consumers(variable))
    seen = set(stack)
    while stack:
        c = stack.pop()
        if c == a or is_state_write(index.ops[c]):
            continue
        reads.append(c)
        if index.ops[c] in ("Identity", "RefIdentity"):
            for d in index.data_consumers(c):
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
    return reads


def _skip(plan: EarlyUpdatesPlan, why: str) -> None:
    plan.skipped[why] = plan.skipped.get(why, 0) + 1
