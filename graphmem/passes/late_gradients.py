"""Late weight gradients: a weight gradient far larger than its inputs runs where the
backward pass holds least.

The inverse of early updates (early_updates.py), for the gradients
analysis/large_gradients.py finds: TF runs fc1's weight gradient of a VGG as soon as the
incoming gradient arrives, at the top of the backward pass, beside every checkpoint the
recompute plan keeps, and its update's temporaries follow it there (Keras' VGG16 at 224
px, batch 32: its 392 MiB gradient and the optimizer's 392 MiB `momentum * velocity` on
top of 568 MiB of checkpoints were the step's estimated peak, in every plan). Its inputs are a few MiB;
held until later in the step, they cost almost nothing.

Where: the step is simulated (analysis/step_estimate.py) and the gradient is made to wait,
by one control edge, for the backward op after which the simulated live bytes over the
next LOOKAHEAD ops are the lowest, among those that do not depend on it. The early-update
edges from its own update into the backward pass go first (they would close a cycle), and
so does the gradient's place in tf.gradients' gate (`gate_gradients=GATE_OP`, the TF1
default: a `tuple` whose `group_deps` NoOp makes the op's input gradient wait for its
weight gradient too, so that the whole backward chain below depends on it: tf-slim's
AlexNet and OverFeat, whose fc6 weight gradients, 100 and 432 MiB at any batch size, ran
beside every checkpoint). The gate's other edges stay: the weight's update still waits for
the input gradient, which reads the weight, as the gate meant. No other edge is touched.
A gradient moved after another also waits for that one's update: two inter-op threads
would otherwise run both from the same anchor, side by side. The step is simulated again,
and the move is kept only when the step holds less while the gradient and its update
run than it held where they ran before (by more than the gradient's inputs and by 5% at
least), and the peak rose by no more than the gradient's inputs, now held longer (the
peak itself may be held elsewhere, by another part of the step: the plan search then
sees the plans whose peak that was). Otherwise every edit is undone. At most MAX_MOVES gradients, largest first: each costs
one simulation of the step.

Only the order changes, never a value: the gradient and its update read what they read
before; the update of a resource variable runs after every read of the value it
replaces, as before (those edges into the update stay).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.large_gradients import (
    LargeGradient,
    has_large_outputs,
    large_gradients,
)
from graphmem.analysis.memory import MemoryEstimate
from graphmem.analysis.regions import Regions, is_state_write, scope_matcher
from graphmem.analysis.step_estimate import estimate_step
from graphmem.analysis.towers import tower_of
from graphmem.graph.index import GraphIndex
from graphmem.graph.workspace import Workspace
from graphmem.passes.base import (
    Edits,
    Pass,
    PassContext,
    PassPlan,
    add_edge_groups,
    add_edges,
    remove_edges,
    skip,
)

LOOKAHEAD = 8  # ops after the anchor the gradient and its update are taken to run beside
MAX_MOVES = 4
MIN_GAIN_SHARE = 20  # a move must lower what is live beside the gradient by 5% at least


@dataclass
class MovedGradient:
    gradient: str
    bytes: int
    after: str  # the backward op it now waits for


@dataclass
class LateGradientsPlan(PassPlan):
    moved: list[MovedGradient] = field(default_factory=list)
    dropped_edges: int = 0  # early-update edges of the moved gradients' updates
    ungated: int = 0  # moved gradients taken out of tf.gradients' gate (GATE_OP)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> gradients

    @property
    def changed(self) -> bool:
        return bool(self.moved)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(self.skipped)


def apply_late_gradients(ws: Workspace, regions: Regions, batch_size: int | None,
                         original: GraphIndex | None = None, backward_scopes=None,
                         host_device: str | None = None) -> LateGradientsPlan:
    """Edit `ws.graph_def` and `ws.index` in place (control edges only). `original`: the
    index of the graph before the passes (theirs append nodes, so its ids hold); an edge
    it has is the user's and is never dropped."""
    index = ws.index
    in_scope = scope_matcher(backward_scopes)
    plan = LateGradientsPlan()
    step = regions.step_nodes(index)
    candidates = large_gradients(index, regions, step, batch_size)
    if not candidates:
        return plan

    def simulate() -> MemoryEstimate:
        return estimate_step(ws, regions, batch_size, backward_scopes, top=0,
                             keep_timeline=True, host_device=host_device)

    before = simulate()
    previous: list[int] = []  # the writes of the gradient moved last
    for c in candidates[:MAX_MOVES]:
        g = c.op
        position = {op: p for p, op in enumerate(before.order)}
        if g not in position:
            skip(plan, "not in the simulated step")
            continue
        ours = set(c.own_ops)
        # early updates' edges leave the update (a state write) for the backward ops;
        # other edges out of its own ops (the in-place decay pieces' order) stay
        dropped = [(u, x) for u in c.own_ops if is_state_write(index.ops[u])
                   for x in index.control_consumers[u]
                   if x in regions.backward and x not in ours
                   and not _original_edge(original, u, x)]
        remove_edges(index, dropped)
        gate = _ungate(index, regions, g)
        anchor = _lowest_point(index, regions, in_scope, before, position, g, ours)
        if anchor is None:
            gate.restore()
            add_edges(index, dropped)
            skip(plan, "no backward op after it that does not depend on it")
            continue
        # after the gradients moved before it, once they are applied: two inter-op threads
        # would otherwise run them side by side from the same anchor (tf-slim AlexNet's fc6
        # and fc7 gradients, 100 and 64 MiB, measured together at two threads)
        edges = [(anchor, g)] + [(w, g) for w in previous
                                 if tower_of(index, w) == tower_of(index, g)]
        added = add_edge_groups(index, {g: edges})
        if not added:
            gate.restore()
            add_edges(index, dropped)
            skip(plan, "its edge would close a cycle")
            continue
        after = simulate()
        if not _better(index, before, position, after, g, ours, c):
            remove_edges(index, added)
            gate.restore()
            add_edges(index, dropped)
            skip(plan, "the simulated step was not lower")
            continue
        plan.moved.append(MovedGradient(index.names[g], c.bytes, index.names[anchor]))
        previous = [u for u in c.own_ops if is_state_write(index.ops[u])]
        plan.dropped_edges += len(dropped)
        plan.ungated += bool(gate.groups)
        before = after
    return plan


@dataclass
class _Gate:
    """The gate groups a gradient was taken out of, with their nodes' inputs and the
    index's control lists as they were, to put back exactly (the input order of a node is
    part of the order TF readies its consumers in, which the walk follows)."""

    index: GraphIndex
    g: int
    groups: list[int]
    inputs: list[list[str]]  # each group's NodeDef inputs
    members: list[list[int]]  # each group's control inputs in the index
    consumers: list[int]  # g's control consumers in the index

    def restore(self) -> None:
        if not self.groups:
            return
        index, g = self.index, self.g
        index.add_control_edges([(g, x) for x in self.groups])
        for x, inputs, members in zip(self.groups, self.inputs, self.members, strict=True):
            node = index.graph_def.node[x]
            del node.input[:]
            node.input.extend(inputs)
            index.control_inputs[x][:] = members
        index.control_consumers[g][:] = self.consumers


def _ungate(index: GraphIndex, regions: Regions, g: int) -> _Gate:
    """Take `g` out of the tf.gradients gates it belongs to: a backward NoOp waiting for
    backward ops alone (control inputs, no data), each of whose readers is an Identity
    forwarding one of them (the `tuple/control_dependency` outputs). Its own Identity keeps
    waiting for the group, so the gradient's readers still wait for its sibling gradients;
    only the siblings' readers stop waiting for it."""
    backward, ops = regions.backward, index.ops
    groups = [x for x in index.control_consumers[g] if ops[x] == "NoOp" and x in backward
              and _is_gate(index, backward, x)]
    gate = _Gate(index, g, groups, [list(index.graph_def.node[x].input) for x in groups],
                 [list(index.control_inputs[x]) for x in groups],
                 list(index.control_consumers[g]))
    remove_edges(index, [(g, x) for x in groups])
    return gate


def _is_gate(index: GraphIndex, backward: set[int], x: int) -> bool:
    members = index.control_inputs[x]
    readers = index.control_consumers[x]
    return not index.data_inputs[x] and len(members) >= 2 and bool(readers) and \
        all(m in backward for m in members) and \
        all(index.ops[r] == "Identity" and r in backward and index.data_inputs[r] and
            index.data_inputs[r][0][0] in members for r in readers)


def _lowest_point(index: GraphIndex, regions: Regions, in_scope, est: MemoryEstimate,
                  position: dict[int, int], g: int, ours: set[int]) -> int | None:
    """The op of the gradient scope after `g` (in the simulated order) with the lowest live
    bytes over the LOOKAHEAD ops from it, outside the span where `g` and its update run
    now, that does not depend on `g` and runs on its device."""
    order, timeline = est.order, est.timeline
    span_end = _span(index, position, g, ours)[1]
    depends = index.descendants([g])
    device = tower_of(index, g)  # with several towers, each waits for its own
    best, best_bytes = None, None
    n = len(index)
    for p in range(position[g] + 1, len(order)):
        a = order[p]
        if p <= span_end or a >= n or a not in regions.backward or a in depends or \
                not in_scope(index.names[a]) or index.in_loop(a) or index.may_be_dead(a) or \
                tower_of(index, a) != device:
            continue
        here = max(timeline[p:p + LOOKAHEAD])
        if best_bytes is None or here < best_bytes:
            best, best_bytes = a, here
    return best


def _better(index: GraphIndex, before: MemoryEstimate, position: dict[int, int],
            after: MemoryEstimate, g: int, ours: set[int], c: LargeGradient) -> bool:
    """The step holds less while the gradient and its update run (from `g` to the last of
    its writes) than it held where they ran before, by more than the gradient's inputs and
    by at least 1/MIN_GAIN_SHARE of it, and its peak rose by no more than the gradient's
    inputs (held longer now: where the peak is elsewhere, they may be live there)."""
    if after.peak_bytes > before.peak_bytes + c.input_bytes:
        return False
    then = _held_while(index, before, position, g, ours)
    now = _held_while(index, after, {op: p for p, op in enumerate(after.order)}, g, ours)
    return then is not None and now is not None and \
        now <= then - max(c.input_bytes, then // MIN_GAIN_SHARE)


def _held_while(index: GraphIndex, est: MemoryEstimate, position: dict[int, int], g: int,
                ours: set[int]) -> int | None:
    """The most bytes live from `g` to the last of its update's writes, in `est`'s order
    (`position`: op -> its place in that order)."""
    if g not in position:
        return None
    start, end = _span(index, position, g, ours)
    return max(est.timeline[start:end + 1])


def _span(index: GraphIndex, position: dict[int, int], g: int, ours: set[int]
          ) -> tuple[int, int]:
    """Where `g` runs and where the last of its updates' writes runs, in the order simulated
    (ops that wait for every update, a train op's group or the global step's increment,
    run at the end: no gradient's own ops, analysis/large_gradients.py)."""
    start = position[g]
    return start, max((position[u] for u in ours
                       if u in position and is_state_write(index.ops[u])), default=start)


def _original_edge(original: GraphIndex | None, u: int, x: int) -> bool:
    return original is not None and x < len(original) and u in original.control_inputs[x]


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LateGradientsPass(Pass):
    """Large weight gradients wait for the backward pass's lowest point."""

    name, edits = "late gradients", Edits.CONTROL_EDGES

    def enabled(self, options) -> bool:
        return options.early_updates

    def applies(self, context: PassContext) -> bool:
        return has_large_outputs(context.index, context.regions, context.options.batch_size)

    def run(self, context: PassContext) -> LateGradientsPlan:
        ws = context.ws
        assert ws.index is context.index  # control-edge passes get the workspace's index
        o = context.options
        return apply_late_gradients(ws, context.regions, o.batch_size, context.given_index,
                                    o.backward_scopes, o.swap.host if o.swap else None)
