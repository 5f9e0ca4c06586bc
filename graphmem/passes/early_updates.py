"""Early updates: let each optimizer update run as soon as its gradient is ready.

TF's executor runs the backward chain depth first, so the weight-gradient updates it readies
on the way wait until the chain ends, and every weight gradient stays alive until then: for
MLPs and transformers that is often the step's peak. This pass adds a control edge from each
update to the backward ops one step further down the chain (the readers of the gradient's
siblings), so the chain cannot run ahead of the updates.

Only the order changes, never a value: an update gets an edge only when every read of its
variable is already ordered before it (so no read can see the new value), and an edge is
only added where it cannot close a cycle. Both facts come from one reverse sweep that marks,
for every op, which updates depend on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions, is_state_write
from graphmem.graph.index import VARIABLE_OPS, GraphIndex


@dataclass
class EarlyUpdatesPlan:
    updates: int = 0  # updates that got edges
    edges: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # why -> updates


def apply_early_updates(index: GraphIndex, regions: Regions) -> EarlyUpdatesPlan:
    plan = EarlyUpdatesPlan()
    backward = regions.backward
    updates = [i for i in sorted(regions.optimizer, key=index.position.__getitem__)
               if is_state_write(index.ops[i]) and _gradient_input(index, i, backward)
               is not None]
    if not updates:
        return plan
    bit = {a: 1 << n for n, a in enumerate(updates)}
    feeds = _update_masks(index, bit)  # op -> mask of the updates that depend on it
    step = regions.step_nodes(index)
    g = index.graph_def
    for a in updates:
        if index.in_loop(a):
            _skip(plan, "inside a loop")
            continue
        variable = _variable_of(index, a)
        if variable is None:
            _skip(plan, "variable not found")
            continue
        reads = [r for r in _reads_of(index, variable, a) if r in step]
        if not all(feeds.get(r, 0) & bit[a] for r in reads):
            _skip(plan, "a read of the variable is not ordered before the update")
            continue
        targets = _next_in_chain(index, a, backward)
        targets = [x for x in targets if not feeds.get(x, 0) & bit[a]]  # no cycle
        if not targets:
            _skip(plan, "no backward op after the gradient")
            continue
        for x in targets:
            g.node[x].input.append("^" + index.names[a])
        plan.updates += 1
        plan.edges += len(targets)
    return plan


def _update_masks(index: GraphIndex, bit: dict[int, int]) -> dict[int, int]:
    mask: dict[int, int] = {}
    for i in reversed(index.topo):
        m = bit.get(i, 0)
        for c in index.data_consumers(i):
            m |= mask.get(c, 0)
        for c in index.control_consumers[i]:
            m |= mask.get(c, 0)
        if m:
            mask[i] = m
    return mask


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
