"""Recompute pass: keep only checkpoints alive until the backward pass, recompute the rest.

For each segment (the forward ops after one checkpoint and up to the next), the ops that the
backward pass needs from it are copied, reading checkpoints and kept tensors at the
segment's boundary; the backward ops that read those activations are pointed at the copies.
The copies are held back by triggers, backward ops that do not depend on them, through
Identities of the copies' inputs that wait for them (`_hold_input`: no copy carries a
control edge, which would keep Grappler from fusing or regrouping it as the original). A
segment's own triggers are the backward ops that feed its backward readers (the gradient
arriving from the later segments); waiting for those, though, serializes the step:
the recomputation of a segment and the gradient ops of the segment before it (in backward
order) can never run side by side. So a segment is held back one segment ahead instead
(`_lead_triggers`): its recomputation starts while the backward pass is still in the next
segment, just early enough to be done when the backward pass gets to it, and it runs on a
second inter-op thread alongside those gradient ops. A trigger may still depend on another
group's copies; where groups would wait for each other that way, they are left without
triggers (`_groups_closing_cycles`), so no cycle can form.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

from graphmem.analysis.activations import ForwardFacts
from graphmem.analysis.arithmetic_groups import inner_roots, regrouped_trees
from graphmem.analysis.broadcast_grads import REDUCTION_OPS
from graphmem.analysis.cost import op_flops
from graphmem.analysis.kernel_fusions import BIAS_GRADIENTS, FILTER_GRADIENTS, merged_reader
from graphmem.analysis.loops import const_ints
from graphmem.analysis.pruning import KEEP_ATTR
from graphmem.analysis.regions import Regions, is_state_write
from graphmem.analysis.removable_ops import may_be_removed
from graphmem.analysis.towers import find_towers, tower_of
from graphmem.graph import dtypes
from graphmem.graph.index import SHAPE_ONLY_OPS, VARIABLE_OPS, GraphIndex, Tensor, kahn
from graphmem.graph.names import OWN_PREFIX, hold_name, input_string, parse_input
from graphmem.graph.names import copy_name as copy_of
from graphmem.graph.names import original_name as original_name  # named here too
from graphmem.graph.reachability import Reachability
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

# how many segments back a segment's copies may reach for ops that are not kept (see
# _independent_groups): enough for a transformer block's chains, linear on any graph
REACH_SEGMENTS = 16
# ops a checkpoint moves along a chain TF merges into one kernel (_past_merged_chains)
MAX_CHAIN = 4
# a batch statistic at most this share of the reduction's input is kept, not recomputed
# (_small_reductions)
SMALL_REDUCTION_SHARE = 1 / 16
# read only their input's shape and dtype: leave them on the original tensor
NO_DATA_READERS = SHAPE_ONLY_OPS | {"ZerosLike", "OnesLike"}


@dataclass
class Segment:
    index: int
    checkpoint: str | None  # the checkpoint the segment starts after (None: the first one)
    targets: list[str]  # activations recomputed for the backward pass
    copied_ops: int
    triggers: list[str]
    ahead: bool = False  # held back by backward ops of the next segment, not its own readers
    tower: str = ""  # the device of its backward readers, with several towers


@dataclass
class RecomputePlan(PassPlan):
    segments: list[Segment] = field(default_factory=list)
    copied_ops: int = 0
    rewired_inputs: int = 0
    kept_blocked: dict[str, int] = field(default_factory=dict)  # why -> saved tensors kept
    not_held_back: list[int] = field(default_factory=list)  # segments without a trigger
    update_guards: int = 0  # control edges that keep ref-variable writes after their copies
    cycle_breaks: int = 0  # groups left without triggers: theirs would have closed a cycle
    shape_readers_released: int = 0  # shape-only readers whose control inputs were moved on
    order_edges: int = 0  # weight gradients ordered before the input gradient beside them
    kept_statistics: int = 0  # saved activations kept as small statistics (_small_reductions)
    # checkpoints inside a sum or product Grappler regroups, kept at the tree's result
    # instead (_past_regrouped_trees)
    checkpoints_to_tree_roots: int = 0
    # checkpoints on an op TF merges with its one reader, moved to the reader's result
    checkpoints_past_fusions: int = 0
    held_through_identity: int = 0  # inputs of copies that hold them back (Identities)
    reshapes_aligned: int = 0  # copies of reshapes to computed shapes given the original's

    @property
    def changed(self) -> bool:  # copies made, inputs rewired or shape readers released
        return bool(self.segments or self.rewired_inputs or self.shape_readers_released)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(self.kept_blocked)


def apply_recompute(index: GraphIndex, regions: Regions, facts: ForwardFacts,
                    checkpoints: list[Tensor], batch_size: int | None = None,
                    lead: bool = True, late_copies: bool = False,
                    weight_grads_first: bool = True,
                    unled: Collection[int] = ()) -> RecomputePlan:
    """Rewrite index.graph_def in place. The index is stale afterwards; rebuild it.
    `lead`: hold segments back one segment ahead (see the module's docstring); without it
    each waits for the inputs of its own backward readers. `late_copies`: a cheap target
    that the rest of its segment is recomputed from gets a second copy for its own
    backward readers (`_late_targets`); with `weight_grads_first`, a weight gradient among
    them reads a copy of its own and runs first (`_readers_first`). `unled`: segment
    numbers that wait for their own readers even with `lead`."""
    plan = RecomputePlan()
    recomputable = facts.recomputable
    trees = regrouped_trees(index)
    inner = inner_roots(trees)
    checkpoints, plan.checkpoints_to_tree_roots = _past_regrouped_trees(checkpoints, inner)
    checkpoints, plan.checkpoints_past_fusions = _past_merged_chains(index, checkpoints)
    small = _small_reductions(index, recomputable, batch_size)
    picked = set(checkpoints)
    keep = picked | small
    for s in regions.saved:
        i = s.tensor[0]
        if i not in recomputable and i in facts.blocked:
            why = facts.blocked[i]
            plan.kept_blocked[why] = plan.kept_blocked.get(why, 0) + 1
    targets = [s for s in regions.saved
               if s.tensor[0] in recomputable and s.tensor not in keep]
    plan.kept_statistics = sum(1 for s in regions.saved
                               if s.tensor in small and s.tensor not in picked)
    if not targets:
        return plan
    # with several towers (one per device, towers.py) each tower is cut by its own
    # checkpoints into its own segments, held back by its own backward ops
    several = find_towers(index, set(facts.recomputable)).several
    cuts_of: dict[str, list[int]] = {}
    cut_names = {index.position[t[0]]: index.tensor_name(t) for t in checkpoints}
    for t in checkpoints:
        cuts_of.setdefault(tower_of(index, t[0]) if several else "", []).append(
            index.position[t[0]])
    for cuts in cuts_of.values():
        cuts.sort()
    by_segment: dict[tuple[str, int], list] = {}
    for s in targets:
        tower = _reader_tower(index, s) if several else ""
        seg = bisect_right(cuts_of.get(tower, []), index.position[s.tensor[0]])
        by_segment.setdefault((tower, seg), []).append(s)
    g = index.graph_def
    rewires: dict[int, dict[int, str]] = {}  # consumer -> input slot -> new input
    groups: list[_Group] = []
    n_late = 0
    order_edges: list[tuple[int, int]] = []  # (op, op to run after it): _readers_first
    reachability: Reachability | None = None  # built for the first late copy needing it
    for tower, seg in sorted(by_segment):
        cut_positions = cuts_of.get(tower, [])
        reach = cut_positions[seg - 1 - REACH_SEGMENTS] if seg > REACH_SEGMENTS else -1
        scope = f"s{seg}" if not tower else \
            f"t{tower.rsplit(':', 2)[-2].lower()}{tower.rsplit(':', 1)[-1]}s{seg}"
        for group_targets, needed in _independent_groups(index, by_segment[(tower, seg)], keep,
                                                         recomputable, reach, inner):
            copy_name = {i: copy_of(index.names[i], scope) for i in needed}
            late = _late_targets(index, group_targets, needed, batch_size) \
                if late_copies else {}
            now = [s for s in group_targets if s.tensor[0] not in late]
            consumers = _rewire(index, now, copy_name, rewires)
            own = _triggers(index, regions, consumers, tower) if consumers else set()
            groups.append(_Group(seg, now, needed, copy_name, consumers, own,
                                 _ref_writes(index, regions, needed), tower=tower))
            for late_targets, chain in _merge_chains(late.values()):
                # a second copy of the targets' chain, for their own readers only: the
                # first one is freed once the rest of the segment is recomputed from it;
                # readers that can run before the gradient op beside them get a copy of
                # their own (_readers_first), so that it too is freed before the next
                first, edges = set(), []
                if weight_grads_first:
                    reachability = reachability or Reachability(index)
                    first, edges = _readers_first(index, regions, late_targets,
                                                  reachability)
                order_edges.extend(edges)
                for only in ([first, _readers(index, late_targets) - first] if first
                             else [None]):
                    n_late += 1
                    late_name = {i: copy_of(index.names[i], f"{scope}_late{n_late}")
                                 for i in chain}
                    readers = _rewire(index, late_targets, late_name, rewires, only)
                    groups.append(_Group(
                        seg, late_targets, chain, late_name, readers,
                        _triggers(index, regions, readers, tower) if readers else set(),
                        _ref_writes(index, regions, chain), tower=tower, late=True))
    # with several towers the executor already has independent work to overlap (the other
    # towers' backward ops): a lead would hold two segments of every tower alive at once
    # (2-tower MLP: 30.5 -> 26.5 MiB measured, same step time at one inter-op thread)
    leads = {} if several or not lead else _lead_triggers(index, regions, groups, batch_size)
    for n, group in enumerate(groups):
        if group.late or group.seg in unled:
            leads.pop(n, None)  # a late copy waits for its own readers' inputs
    for n, group in enumerate(groups):
        group.triggers = leads.get(n) or group.own
    closing, cut = _groups_closing_cycles(index, groups, rewires, order_edges)
    for n in closing:
        groups[n].triggers = set()  # not held back rather than a cycle
        leads.pop(n, None)
        plan.cycle_breaks += 1
    order_edges = [e for e in dict.fromkeys(order_edges) if e not in cut]
    aligned: dict[int, str] = {}  # reshape -> the Shape of its result its copies read
    for n, group in enumerate(groups):
        seg, needed, copy_name, triggers = group.seg, group.needed, group.copy_name, \
            group.triggers
        cut_positions = cuts_of.get(group.tower, [])
        start = cut_positions[seg - 1] if seg > 0 else None
        held = ["^" + index.names[t] for t in sorted(triggers)]
        copies = set(copy_name.values())
        made = []
        holds: dict[str, str] = {}  # an input the group's first ops read -> its hold
        for i in sorted(needed, key=index.position.__getitem__):
            # appended in place (node ids of the graph stay as the index has them)
            node = g.node.add()
            made.append(node)
            reads_copy = _copy_node(index, i, copy_name, node)
            if index.ops[i] == "Reshape" and _align_reshape(index, i, node, g, aligned):
                plan.reshapes_aligned += 1
                reads_copy = any(parse_input(t)[0] in copies for t in node.input)
            if reads_copy or not held:
                continue
            # the group's first ops: the triggers hold them back through an Identity of an
            # input, so that no copy carries a control edge (_hold_input)
            if not _hold_input(index, i, node, g, held, holds, str(n)):
                node.input.extend(held)
        _read_holds(made, holds)
        plan.held_through_identity += len(holds)
        if not triggers:
            plan.not_held_back.append(seg)
        for w, i in group.ref_writes:
            g.node[w].input.append("^" + copy_name[i])
        plan.update_guards += len(group.ref_writes)
        plan.segments.append(Segment(
            seg, cut_names.get(start) if start is not None else None,
            [s.name for s in group.targets], len(needed),
            [index.names[t] for t in sorted(triggers)], n in leads, group.tower))
        plan.copied_ops += len(needed)
    for c, slots in rewires.items():
        node = g.node[c]
        for slot, text in slots.items():
            node.input[slot] = text
            plan.rewired_inputs += 1
    for before, after in order_edges:
        g.node[after].input.append("^" + index.names[before])
    plan.order_edges = len(order_edges)
    plan.shape_readers_released = _release_shape_readers(index, regions)
    return plan


def _small_reductions(index: GraphIndex, recomputable: set[int],
                      batch_size: int | None) -> set[Tensor]:
    """Batch statistics: outputs of forward reductions over the batch axis (among others)
    that are much smaller than their input (an unfused batch norm's mean and variance, per
    channel), and what is computed from them alone and stays as small (the variance's
    reciprocal square root, the batch norm's scale and offset).

    Kept rather than recomputed, they cost next to no memory at any batch size, and the
    copies start after them: recomputing an unfused batch norm's `moments` (Keras'
    MobileNetV2 at 224 px) ran a memory-bound mean, a full-size squared difference and a
    second mean per layer, slower than their FLOPs say, with the squared difference's
    buffer live beside the copies. Recomputing only part of them would make many one-op
    copy groups whose triggers wait on each other (the cycle check then releases the large
    groups too). Statistics per example (a layer norm's, per row) are left to the plan:
    keeping them changed which of the copies run together in the top segment of a Keras
    transformer LM, whose peak then measured higher (0.27x -> 0.30x of the original at one
    inter-op thread, `benchmarks/side_by_side.py`)."""
    size = index.output_bytes(batch_size)
    nodes = index.graph_def.node
    bound: dict[int, int] = {}  # op -> bytes its outputs stay within
    stack = []
    for i in recomputable:
        if index.ops[i] not in REDUCTION_OPS or len(index.data_inputs[i]) < 2:
            continue
        (src, k), (axes, _) = index.data_inputs[i][:2]
        have, feed = size(i)[0], size(src)[k]
        if have is None or not feed or have > feed * SMALL_REDUCTION_SHARE:
            continue
        values = const_ints(nodes[axes]) if index.ops[axes] == "Const" else None
        if values is None or 0 not in ([values] if isinstance(values, int) else values):
            continue  # not over the batch axis
        bound[i] = int(feed * SMALL_REDUCTION_SHARE)
        stack.append(i)
    while stack:
        i = stack.pop()
        for c in index.data_consumers(i):
            if c in bound or c not in recomputable:
                continue
            sizes = size(c)
            if sizes and all(n is not None and n <= bound[i] for n in sizes):
                bound[c] = bound[i]
                stack.append(c)
    return {(i, k) for i in bound for k in range(index.num_outputs[i])}


def _reader_tower(index: GraphIndex, s) -> str:
    """A saved activation's tower: the device of its backward readers (the first's), where
    its copies' triggers must be; its op's own device when none is placed."""
    for c in s.consumers:
        tower = tower_of(index, c)
        if tower:
            return tower
    return tower_of(index, s.tensor[0])


def _release_shape_readers(index: GraphIndex, regions: Regions) -> int:
    """Let backward shape readers of forward tensors run as soon as the tensor exists.

    Shape readers keep reading the original tensor (pointing them at a copy would pull the
    copy's recomputation earlier), and TF keeps a buffer alive until its last reader has run.
    A shape reader built under `control_dependencies(UPDATE_OPS)` (TF1 batch-norm models)
    waits for every moving-average update, i.e. for the end of the forward pass, and so keeps
    the whole activation it measures alive until then: what recompute was meant to free.
    Its control inputs only order it (a shape does not depend on them), so they are moved to
    its readers, which keeps every ordering its readers had, and the shape reader runs early.
    Each moved edge runs from an ancestor of the reader's consumer to it: no cycle can form.
    Shape readers inside loops, or whose readers are, and those no op reads are left alone.
    """
    g = index.graph_def
    forward, backward = regions.forward, regions.backward
    readers = [i for i in index.topo if i in backward and index.ops[i] in SHAPE_ONLY_OPS
               and not index.in_loop(i) and any(s in forward for s, _ in index.data_inputs[i])]
    released = 0
    for c in readers:  # in topological order: edges moved onto a later reader move on
        node = g.node[c]
        moved = [x for x in node.input if x.startswith("^")]
        takers = index.data_consumers(c) + index.control_consumers[c]
        if not moved or not takers or any(index.in_loop(d) for d in takers):
            continue
        data = [x for x in node.input if not x.startswith("^")]
        del node.input[:]
        node.input.extend(data)
        for d in dict.fromkeys(takers):
            have = set(g.node[d].input)
            g.node[d].input.extend(x for x in moved if x not in have)
        released += 1
    return released


# A segment's recomputation starts when the backward pass enters the part of the next segment
# (in backward order) whose forward FLOPs are LEAD_RATIO times the segment's recompute FLOPs.
# Gradient ops cost about twice their forward op, so at 0.5 one thread's recomputation ends
# about when the other thread, busy with that part's gradient ops, needs it: later leaves the
# thread idle, earlier only keeps more of both segments alive at once.
LEAD_RATIO = 0.5
# segments of a tower apart by at most this many empty ones still lead: one empty segment
# is one checkpoint kept whole between two cuts (a dropout's mask and output, both kept),
# whose backward is a few elementwise ops
LEAD_GAP = 1


@dataclass
class _Group:
    """Copies of one segment that share ops, and the backward ops that read them."""

    seg: int
    targets: list  # SavedActivations recomputed
    needed: set[int]  # ops copied
    copy_name: dict[int, str]
    consumers: set[int]  # backward ops pointed at the copies
    own: set[int]  # triggers just before the group's first reader
    ref_writes: list[tuple[int, int]]  # (optimizer write, copied op) to order after the copy
    triggers: set[int] = field(default_factory=set)  # chosen: one segment ahead, or own
    tower: str = ""  # with several towers: the device whose backward ops read the copies
    late: bool = False  # a second copy of one cheap target, for its own readers


# A target gets a late copy when recomputing it costs at most this share of its group's
# FLOPs: the first layers of a CNN (a 3-channel input's convolution is ~5% of VGG's first
# two) are cheap to run twice and their outputs are the largest tensors of the step
LATE_FLOPS_SHARE = 0.1


def _late_targets(index: GraphIndex, targets: list, needed: set[int],
                  batch_size: int | None) -> dict[int, tuple]:
    """Targets of a group that other copies of the group are computed from and that are
    cheap to compute again: op -> (target, the ops of its chain within the group).

    The copy the group makes of such a target is read by the group's later copies and by
    the target's own backward readers, which run last (backward order): it stays alive
    through the backward ops of everything computed from it (tf-slim VGG-16 at 224 px: the
    first convolution's 392 MiB output, live beside the second's and its gradient). A
    second copy of its chain, held back by its own readers, lets the first one go."""
    if len(targets) < 2:
        return {}
    costs = {i: op_flops(index, i, batch_size or 1) for i in needed}
    total = sum(costs.values())
    out = {}
    for s in targets:
        i = s.tensor[0]
        if not any(c in needed for c in index.data_consumers(i)):
            continue  # nothing else is computed from it
        chain, stack = {i}, [i]
        while stack:
            for src, _ in index.data_inputs[stack.pop()]:
                if src in needed and src not in chain:
                    chain.add(src)
                    stack.append(src)
        if sum(costs[j] for j in chain) <= LATE_FLOPS_SHARE * total and \
                not any(index.stateful[j] for j in chain):
            out[i] = (s, chain)
    return out


def _readers(index: GraphIndex, targets: list) -> set[int]:
    """The targets' backward readers that copies are for (not those reading a shape)."""
    return {c for s in targets for c in s.consumers if index.ops[c] not in NO_DATA_READERS}


def _readers_first(index: GraphIndex, regions: Regions, targets: list,
                   reach: Reachability) -> tuple[set[int], list[tuple[int, int]]]:
    """Readers of late targets that can run before the gradient op beside them, and the
    ordering edges (reader, sibling) that make them run first.

    A layer's weight gradient reads the layer's input (a target) and the gradient arriving
    at the layer; its input gradient reads that same gradient and leads to the target's
    other backward readers (its own activation's gradient). TF may run the input gradient
    first: then the incoming gradient, the input gradient and the target's copy are live
    together (tf-slim VGG-16 at 224 px, in the estimate: 3 x 392 MiB at conv1_2's backward). Run the weight
    gradient first and give it a copy of its own, and that copy is freed before the input
    gradient runs; the other readers get a second copy, made once the input gradient and
    the weight gradient have run: two of the three are live at a time.

    A reader qualifies when another reader of the same gradient tensor (its sibling) is
    known to be an ancestor of another reader of the targets and known not to be one of
    the reader itself (`reach`: an unsettled question counts as no edge); where the
    copies' edges would still close a cycle through the edge, it is dropped
    (_groups_closing_cycles)."""
    backward = regions.backward
    held = {s.tensor for s in targets}
    readers = sorted((c for c in _readers(index, targets) if not index.in_loop(c)),
                     key=index.position.__getitem__)
    if len(readers) < 2:
        return set(), []
    first: set[int] = set()
    edges: list[tuple[int, int]] = []
    for w in readers:
        others = [r for r in readers if r != w]
        siblings = set()
        for t in index.data_inputs[w]:
            if t in held or t[0] not in backward:
                continue
            siblings.update(c for c in index.data_consumers(t[0])
                            if c != w and c in backward and t in index.data_inputs[c]
                            and c not in readers and not index.in_loop(c))
        found = [c for c in sorted(siblings)
                 if any(reach.reaches(c, r) is True for r in others)
                 and reach.reaches(c, w) is False]  # an edge from w would close a cycle
        if found:
            first.add(w)
            edges.extend((w, c) for c in found)
    if len(first) == len(readers):
        return set(), []  # nothing left for the second copy
    return first, edges


def _merge_chains(late) -> list[tuple[list, set[int]]]:
    """Late targets whose chains share ops, as one copy: (targets, the chains' union)."""
    merged: list[tuple[list, set[int]]] = []
    for target, chain in late:
        for targets, ops in merged:
            if ops & chain:
                targets.append(target)
                ops |= chain
                break
        else:
            merged.append(([target], set(chain)))
    return merged


def _lead_triggers(index: GraphIndex, regions: Regions, groups: list[_Group],
                   batch_size: int | None) -> dict[int, set[int]]:
    """Triggers one segment ahead, by group number; groups left out keep their own.

    For segment k, the next segment is k + 1, when it has copies (its backward runs just
    before k's; when it has none, k keeps its own triggers). Walking that segment's copied
    ops up from its bottom, the cut is where their forward FLOPs reach LEAD_RATIO times
    those of k's copies; k's triggers are then those of the next segment's targets below
    the cut: the backward ops that bring the gradient into that part. One walk per
    segment: linear in the ops copied. A lead trigger
    must sit before every reader of the group's copies and every optimizer write ordered
    after them in the topological order, so it cannot depend on the copies (no cycle);
    otherwise the group keeps its own triggers.
    """
    by_seg: dict[tuple[str, int], list[_Group]] = {}  # (tower, segment) -> groups
    for group in groups:
        by_seg.setdefault((group.tower, group.seg), []).append(group)
    segs = sorted(by_seg)
    position = index.position

    costs: dict[int, int] = {}  # each copied op is costed twice: for its own segment's
    # total and in the walk up the segment after (op_flops reads a matmul's attrs)

    def cost(i: int) -> int:
        found = costs.get(i)
        if found is None:  # only ratios matter: any batch will do
            found = costs[i] = op_flops(index, i, batch_size or 1)
        return found

    lead_of_seg: dict[tuple[str, int], set[int]] = {}
    for k, seg in enumerate(segs[:-1]):
        if segs[k + 1][0] != seg[0] or segs[k + 1][1] - seg[1] > 1 + LEAD_GAP:
            # checkpoints kept whole lie between (a budget plan's): the backward pass
            # through them runs between the next segment's and this one's, so a lead
            # taken from the next segment would hold the copies through all of it
            continue
        nxt = by_seg[segs[k + 1]]
        ops = sorted({i for h in nxt for i in h.needed}, key=position.__getitem__)
        want = LEAD_RATIO * sum(cost(i) for h in by_seg[seg] for i in h.needed)
        cut, acc = position[ops[-1]], 0
        for i in ops:  # bottom up
            acc += cost(i)
            if acc >= want:
                cut = position[i]
                break
        # at least the lowest target: its readers are the first gradient ops of the part
        cut = max(cut, min(position[s.tensor[0]] for h in nxt for s in h.targets))
        readers = {c for h in nxt for s in h.targets if position[s.tensor[0]] <= cut
                   for c in s.consumers if c in h.consumers}
        lead_of_seg[seg] = _triggers(index, regions, readers, seg[0]) if readers else set()
    out: dict[int, set[int]] = {}
    for n, group in enumerate(groups):
        lead = lead_of_seg.get((group.tower, group.seg))
        if not lead or not group.consumers:
            continue
        bound = min([position[c] for c in group.consumers] +
                    [position[w] for w, _ in group.ref_writes])
        if all(position[t] < bound for t in lead):
            out[n] = lead
    return out


def _groups_closing_cycles(index: GraphIndex, groups: list[_Group],
                           rewires: dict[int, dict[int, str]],
                           order_edges: list[tuple[int, int]] = ()
                           ) -> tuple[list[int], set[tuple[int, int]]]:
    """The groups whose trigger edges take part in a cycle of the rewritten graph, and the
    ordering edges (_readers_first) that do.

    Each group's triggers are chosen so that they do not depend on its own consumers, but a
    trigger may depend on another group's consumers: when two groups' consumers are
    siblings (both fed by one gradient, as the two branches of a custom-gradient swish),
    each can be the other's trigger, and the copies wait for each other. Cheap test first:
    when every group's triggers come before all its consumers in the original order, and
    every ordering edge runs forward in it, the copies can be placed between triggers and
    consumers and every edge runs forward. Otherwise one Kahn pass over the rewritten graph
    (copies included) finds the ops left waiting; every cycle runs through a trigger edge or
    an ordering edge (without them the copies only read forward ops), so the groups with a
    trigger edge between two waiting ops lose their triggers, the ordering edges between
    two waiting ops are dropped, and the pass repeats until nothing waits."""
    position = index.position
    suspects = [k for k, grp in enumerate(groups) if grp.triggers and grp.consumers and
                max(position[t] for t in grp.triggers) >=
                min(position[c] for c in grp.consumers)]
    if not suspects and all(position[a] < position[b] for a, b in order_edges):
        return [], set()
    n = len(index)
    copy_id: dict[str, int] = {}
    owner: list[int] = []  # copy -> its group
    for k, grp in enumerate(groups):
        for i in sorted(grp.needed):
            copy_id[grp.copy_name[i]] = n + len(owner)
            owner.append(k)
    copy_preds: list[list[int]] = []  # of each copy, triggers apart: its original's inputs,
    for grp in groups:  # copies of the same group where there is one
        for i in sorted(grp.needed):
            ins = [s for s, _ in index.data_inputs[i]] + index.control_inputs[i]
            copy_preds.append([copy_id[grp.copy_name[j]] if j in grp.copy_name else j
                               for j in ins])
    original = [index.ordering_preds(i) for i in range(n)]  # what each op waits for
    for i, slots in rewires.items():  # backward readers pointed at copies (never a Merge)
        data = [s for s, _ in index.data_inputs[i]]
        for slot, text in slots.items():
            data[slot] = copy_id[parse_input(text)[0]]  # data inputs come first in a node
        original[i] = data + index.control_inputs[i]
    dropped: set[int] = set()
    cut: set[tuple[int, int]] = set()
    while True:
        preds = list(original)
        for a, b in order_edges:
            if (a, b) not in cut:
                preds[b] = preds[b] + [a]
        _, indeg = kahn(preds + [
            copy_preds[c] + ([] if k in dropped else list(groups[k].triggers))
            for c, k in enumerate(owner)])
        culprits = {k for c, k in enumerate(owner) if indeg[n + c] > 0 and k not in dropped
                    and any(indeg[t] > 0 for t in groups[k].triggers)}
        edges = {(a, b) for a, b in order_edges
                 if (a, b) not in cut and indeg[a] > 0 and indeg[b] > 0}
        if not culprits and not edges:
            return sorted(dropped), cut
        dropped |= culprits
        cut |= edges


def _past_regrouped_trees(checkpoints: list[Tensor], inner: dict[int, int]
                          ) -> tuple[list[Tensor], int]:
    """The checkpoints with each one inside a tree Grappler regroups (analysis/
    arithmetic_groups.py) moved to the tree's result, and how many moved. Copies reading a
    checkpoint there would give its op a second reader, which takes it out of the tree:
    TF would then sum the original's tree, and the copy's, in other orders than it sums
    the untouched graph's, and training would drift by float rounding (Keras NASNetMobile:
    1e-6 in the first step's loss, 0.08 after five). The tree's result holds as many bytes
    as the op inside it and is made a few elementwise ops later."""
    moved = [(inner[t[0]], 0) if t[0] in inner else t for t in checkpoints]
    return list(dict.fromkeys(moved)), sum(1 for t in checkpoints if t[0] in inner)


def _past_merged_chains(index: GraphIndex, checkpoints: list[Tensor]
                        ) -> tuple[list[Tensor], int]:
    """The checkpoints with each one on an op that TF merges with its one reader (a
    convolution's `BiasAdd` and its `Relu`: analysis/kernel_fusions.py, `merged_reader`)
    moved to the reader's result, along the chain, and how many moved. The copies reading a
    checkpoint there would give the op a second reader, and TF would then run the
    original's pair as two kernels where it ran one: oneDNN computes the fused convolution
    with a ReLU as a kernel of its own, which sums in another order (Keras
    MobileNetV3Large's speed rewrite: its squeeze-and-excitation convolutions, momentums
    2e-9 apart after one step with Grappler on). The reader's result holds as many bytes
    and is made by the same kernel."""
    moved = 0
    out = []
    for t in checkpoints:
        at = t
        for _ in range(MAX_CHAIN):
            nxt = merged_reader(index, at)
            if nxt is None:
                break
            at = nxt
        moved += at != t
        out.append(at)
    return list(dict.fromkeys(out)), moved


def _hold_input(index: GraphIndex, i: int, node, g, held: list[str],
                holds: dict[str, str], scope: str) -> bool:
    """Hold the copy `node` of op i back by an Identity of one of its inputs that waits
    for `held` (marked for Grappler to keep), shared by every copy of the group that reads
    that input (`_read_holds`); returns False where no input can be held so (only
    constants, or no tensor of a plain dtype).

    Why not a control edge on the copy: Grappler leaves an op with control edges out of
    what it rebuilds, and TF rounds what it rebuilt differently from what it left alone.
    Its arithmetic optimizer regroups a sum or product only of ops without them, and its
    remapper fuses only such ops: the forward `x * sigmoid(x)` of Keras' swish became one
    `_MklSwish` kernel (oneDNN), while the copy, whose `sigmoid` waited for a trigger,
    stayed two Eigen kernels (Keras EfficientNetV2B0's squeeze-and-excitation blocks:
    momentums 6e-11 apart after one step). Every copy reading the held input reads the
    Identity, so a pattern whose ops read one tensor twice (`Mul(x, Sigmoid(x))`) still
    reads one there."""
    data = [text for text in node.input if not text.startswith("^")]
    for text, t in zip(data, index.data_inputs[i], strict=False):
        if text in holds:
            return True
        dtype = index.dtype(t)
        if index.ops[t[0]] in ("Const", "HostConst") or dtype is None or \
                dtype == dtypes.RESOURCE or dtypes.is_ref(dtype):
            continue
        name = holds[text] = hold_name(index.names[t[0]], t[1], scope)
        hold = g.node.add(name=name, op="Identity", device=node.device)
        hold.input.extend([text, *held])
        hold.attr["T"].type = dtype
        # Grappler would bypass it, handing its edges to the copies
        hold.attr[KEEP_ATTR].b = True
        return True
    return False


def _read_holds(made: list, holds: dict[str, str]) -> None:
    """Point the group's copies' reads of held inputs at their holds."""
    if not holds:
        return
    for node in made:
        for k, text in enumerate(node.input):
            hold = holds.get(text)
            if hold is not None:
                node.input[k] = hold


def _independent_groups(index: GraphIndex, targets: list, keep: set[Tensor],
                        recomputable: set[int], reach: int,
                        inner: dict[int, int]) -> list[tuple[list, set[int]]]:
    """Split a segment's targets into groups whose copies share no op, so that each group
    is held back by the backward ops that need it, not by those of an unrelated branch.

    Copies reach back to kept tensors, and no further than `reach` (a topological position,
    REACH_SEGMENTS segments back): an op before it is read as it is, which keeps its output
    alive like a checkpoint. Without that bound, checkpoints that do not cut the graph (the
    speed policy keeps matmul outputs; a residual chain's adds go around them) would make
    every segment copy the whole chain before it, quadratic in the depth.
    An op inside a tree Grappler regroups (`inner`) is copied whenever its reader is,
    whatever the bounds: read as it is, it would get a second reader and leave its tree."""
    position = index.position
    parent: list[int] = list(range(len(targets)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    # one walk over all targets: an op reached again joins its owner's group instead of
    # being walked again, so the cost is linear in the ops copied
    owner: dict[int, int] = {}
    for t_id, s in enumerate(targets):
        stack = [s.tensor[0]]
        while stack:
            i = stack.pop()
            if i in owner:
                a, b = find(owner[i]), find(t_id)
                if a != b:
                    parent[a] = b
                continue
            owner[i] = t_id
            for src, k in index.data_inputs[i]:
                if src in recomputable and ((src, k) not in keep and position[src] > reach
                                            or src in inner):
                    stack.append(src)
    groups: dict[int, tuple[list, set[int]]] = {}
    for t_id, s in enumerate(targets):
        groups.setdefault(find(t_id), ([], set()))[0].append(s)
    for i, t_id in owner.items():
        groups[find(t_id)][1].add(i)
    return [groups[k] for k in sorted(groups)]


def _rewire(index: GraphIndex, targets: list, copy_name: dict[int, str],
            rewires: dict[int, dict[int, str]], only: set[int] | None = None) -> set[int]:
    """Point the targets' backward readers (those in `only`, if given) at the copies;
    returns those readers."""
    g = index.graph_def
    consumers: set[int] = set()
    for s in targets:
        new_input = input_string(copy_name[s.tensor[0]], s.tensor[1])
        for c in s.consumers:
            if index.ops[c] in NO_DATA_READERS or (only is not None and c not in only):
                continue
            if not index.control_inputs[c]:
                # every input is a data input: its slot is its place in data_inputs, and
                # the NodeDef need not be read again
                slots = [slot for slot, t in enumerate(index.data_inputs[c]) if t == s.tensor]
            else:
                slots = [slot for slot, text in enumerate(g.node[c].input)
                         if _reads(index, parse_input(text), s.tensor)]
            for slot in slots:
                rewires.setdefault(c, {})[slot] = new_input
                consumers.add(c)
    return consumers


def _reads(index: GraphIndex, parsed: tuple[str, int, bool], tensor: Tensor) -> bool:
    """Whether a parsed input string (name, output, control) reads `tensor`."""
    name, k, ctrl = parsed
    return not ctrl and index.id_of[name] == tensor[0] and k == tensor[1]


def _copy_node(index: GraphIndex, i: int, copy_name: dict[int, str], node) -> bool:
    """Make `node` a copy of op i named copy_name[i], reading the copies of the ops that
    have one; returns whether it reads any (data or control)."""
    original = index.graph_def.node[i]
    node.CopyFrom(original)
    node.name = copy_name[i]
    id_of = index.id_of
    inputs = []
    reads_copy = False
    for text in original.input:
        j = id_of.get(text)  # the common form: output 0 of an op, written bare
        if j is not None:
            name = copy_name.get(j)
            if name is not None:
                text = name
                reads_copy = True
        else:
            name, k, ctrl = parse_input(text)
            j = id_of[name]
            if j in copy_name:
                text = "^" + copy_name[j] if ctrl else input_string(copy_name[j], k)
                reads_copy = True
        inputs.append(text)
    del node.input[:]
    node.input.extend(inputs)
    return reads_copy


def _align_reshape(index: GraphIndex, i: int, node, g, aligned: dict[int, str]) -> bool:
    """Give the copy `node` of `Reshape` op i the original's result's shape as its shape
    input, when the original reshapes to a computed shape with dimensions unknown until
    it runs; returns whether it did.

    Why: TF's shape inference gives a reshape to a computed shape dimensions of its own,
    and Grappler's arithmetic optimizer regroups a product only where it can prove its
    operands broadcast. The copy's dimensions would differ from the original's, so a
    gradient product of a value from the copies and one from the original (Keras' `Dense`
    on a 4-D tensor reshapes through `Tensordot`; ConvNeXt's GELU gradient) is regrouped
    in the original and not in the rewrite, and rounds differently. Read as the shape of
    the original's result, the copy's dimensions are the original's. The `Shape` reads
    the original as soon as it exists, in the forward pass; the value is the same."""
    shape_input = index.data_inputs[i][1] if len(index.data_inputs[i]) == 2 else None
    dims = index.shape((i, 0))
    if shape_input is None or index.ops[shape_input[0]] == "Const" or \
            (dims is not None and all(d >= 0 for d in dims)):
        return False
    name = aligned.get(i)
    if name is None:
        name = aligned[i] = f"{index.names[i]}/{OWN_PREFIX}shape"
        shape = g.node.add(name=name, op="Shape", device=node.device)
        shape.input.append(index.names[i])
        shape.attr["T"].CopyFrom(node.attr["T"])
        shape.attr["out_type"].type = index.dtype(shape_input) or dtypes.INT32
    node.input[1] = name
    return True


def _triggers(index: GraphIndex, regions: Regions, consumers: set[int],
              tower: str = "") -> set[int]:
    """The nearest backward ancestors of `consumers` that do not depend on them.

    Walking up from the consumers, a backward op that depends on a consumer is passed
    through, and so is one Grappler may remove (analysis/removable_ops.py: an edge of
    ours would keep it, and a gradient sum would add its terms in another order); the
    first ones that do not are the triggers. Only ops placed before the last
    consumer can be ancestors, which bounds both walks. With several towers (`tower`, a
    device), an op of another device is passed through too: a trigger is a backward op of
    the copies' own tower, so that no tower's recomputation waits for another's.

    A consumer's own control inputs are kept meaningful (`_kept_control_sources`): no
    trigger is one of them or depends on one.
    """
    horizon = max(index.position[c] for c in consumers)
    downstream = _downstream(index, consumers, horizon)
    triggers = _walk_to_triggers(index, regions, consumers, downstream, tower)
    kept = _kept_control_sources(index, regions, consumers, triggers)
    if kept and not triggers.isdisjoint(after := _downstream(index, kept, horizon)):
        # some trigger is such a source or depends on one: walk again, past them
        apart = _walk_to_triggers(index, regions, consumers, downstream | after, tower)
        if apart:
            return apart
    return triggers


def _kept_control_sources(index: GraphIndex, regions: Regions, consumers: set[int],
                          triggers: set[int]) -> set[int]:
    """The backward ops that hold back a consumer by a control edge of the graph as given
    and that a trigger would otherwise be, or depend on.

    Why: a copy that waits for such an op makes the consumer's control edge implied by its
    data input, and Grappler's dependency optimizer drops it. The edge is what kept the
    consumer apart from the forward op it repeats: `tf.nn.silu`'s gradient recomputes
    `sigmoid(x)` under `control_dependencies([dy])`. Without it Grappler merges that
    sigmoid with the copy of the forward one (common subgraph elimination), the copy's
    `x * sigmoid(x)` then no longer has a sigmoid of its own, and the oneDNN remapper
    leaves it unfused where it fused the forward product into `_MklSwish`: the recomputed
    activation rounds differently (Keras EfficientNetV2B0, its first layers' momentums by
    4e-8 after one step). Sources placed before every trigger are left out: holding the
    copies back that far would undo the plan.
    """
    if not triggers:
        return set()
    first = min(index.position[t] for t in triggers)
    return {d for c in consumers for d in index.control_inputs[c]
            if d in regions.backward and index.position[d] >= first}


def _downstream(index: GraphIndex, seeds: set[int], horizon: int) -> set[int]:
    """`seeds` and the ops placed up to `horizon` that depend on one of them."""
    out = set(seeds)
    queue = deque(seeds)
    while queue:
        i = queue.popleft()
        for j in index.data_consumers(i) + index.control_consumers[i]:
            if j not in out and index.position[j] <= horizon:
                out.add(j)
                queue.append(j)
    return out


def _walk_to_triggers(index: GraphIndex, regions: Regions, consumers: set[int],
                      downstream: set[int], tower: str) -> set[int]:
    """`_triggers`' walk up from the consumers; the ops of `downstream` are passed
    through."""
    backward = regions.backward

    def can_hold(s: int) -> bool:
        # an op in a tf.cond branch (v1) would make the copies dead when its branch is not
        # taken: the walk goes past it to the ops that always run
        return s not in downstream and not index.may_be_dead(s) and \
            not (tower and tower_of(index, s) != tower)

    triggers: set[int] = set()
    seen = set(consumers)
    queue = deque(consumers)
    while queue:
        i = queue.popleft()
        for s, _ in index.data_inputs[i]:
            if s in seen or s not in backward or index.in_loop(s):
                continue  # an op inside a loop frame cannot hold back one outside it
            seen.add(s)
            if _tuple_identity(index, s):
                queue.append(s)
                for w in _tuple_siblings(index, s):
                    if w not in seen and w in backward and not index.in_loop(w) and \
                            can_hold(w):
                        seen.add(w)
                        triggers.add(w)
            elif can_hold(s) and not may_be_removed(index, s):
                triggers.add(s)
                filters, biases = _weight_gradients_beside(index, s, backward)
                held = [w for w in filters if w not in seen and can_hold(w)]
                if held:  # the bias gradients TF merges with them, only with them
                    held += [w for w in biases if w not in seen and can_hold(w)]
                seen.update(held)
                triggers.update(held)
            else:
                queue.append(s)
    return triggers


def _weight_gradients_beside(index: GraphIndex, s: int, backward: set[int]
                             ) -> tuple[list[int], list[int]]:
    """The weight gradients that read a backward tensor `s` reads: a layer's filter
    gradient beside its input gradient (both read the gradient entering the layer).

    Copies wait for them too, as for TF1's gradient tuples (`_tuple_siblings`), which a
    `GradientTape` does not build: a filter gradient is the last reader of the incoming
    gradient and of the layer's input, and recomputing the next segment while it is still
    pending keeps both alive beside the new copies (Keras' VGG16 at 224 px, in the
    estimate's live set: block2_conv1's 196 MiB incoming gradient and its 98 MiB input
    gradient, live through the recomputation of block1). Returned with the bias gradients reading the same tensor:
    TF merges each filter gradient with its bias gradient into one kernel
    (passes/fusion_guard.py), so the copies wait for a bias gradient only where they wait
    for a filter gradient beside it, as TF runs them."""
    filters: list[int] = []
    biases: list[int] = []
    for x, k in index.data_inputs[s]:
        if x not in backward:
            continue
        readers = [w for w in index.data_consumers(x)
                   if w != s and w in backward and not index.in_loop(w)
                   and (x, k) in index.data_inputs[w]]
        if any(index.ops[w] in FILTER_GRADIENTS for w in readers):
            filters += [w for w in readers if index.ops[w] in FILTER_GRADIENTS]
            biases += [w for w in readers if index.ops[w] in BIAS_GRADIENTS]
    return filters, biases


def _tuple_siblings(index: GraphIndex, s: int) -> list[int]:
    """The ops a TF1 gradient tuple's Identity `s` waits for besides its own input: the
    weight gradient computed beside an input gradient (`Conv2D_grad/tuple` groups
    Conv2DBackpropInput with Conv2DBackpropFilter, a dense layer's two MatMuls likewise).

    Copies wait for them too. A weight gradient is the last reader of the gradient entering
    its layer and of the layer's input (a checkpoint); recomputing the next segment while it
    is still pending keeps both alive beside the new copies (tf-slim VGG-16 at 224 px: the
    conv2_1 filter gradient's 196 MiB incoming gradient and 98 MiB input, live through the
    recomputation of conv1). Bias gradients are left out: TF merges a filter gradient with
    its bias gradient, and the filter gradient may read the copies (passes/fusion_guard.py).
    """
    out = []
    own = index.data_inputs[s][0][0] if index.data_inputs[s] else None
    for g in index.control_inputs[s]:
        for w in (index.control_inputs[g] if index.ops[g] == "NoOp" else [g]):
            if w != own and index.ops[w] not in BIAS_GRADIENTS:
                out.append(w)
    return out


def _tuple_identity(index: GraphIndex, s: int) -> bool:
    """An Identity that also waits for other ops (TF1's gradient `tuple`: a gradient waits
    for its siblings, a bias gradient among them). Copies wait for the op under it instead:
    once Grappler removes the Identity its wait passes to them, and a copy that waits for a
    bias gradient, read by the filter gradient TF merges with it, closes a cycle
    (passes/fusion_guard.py)."""
    return index.ops[s] == "Identity" and bool(index.control_inputs[s])


def _ref_writes(index: GraphIndex, regions: Regions, needed: set[int]) -> list[tuple[int, int]]:
    """(optimizer write, copied op) pairs: a copy reading a ref variable's value must run
    before the optimizer writes that variable, so the write gets a control edge from it."""
    out = []
    for i in needed:
        for s, k in index.data_inputs[i]:
            var = _ref_variable_behind(index, s, k)
            if var is None:
                continue
            for w in index.data_consumers(var):
                if is_state_write(index.ops[w]) and w in regions.optimizer:
                    out.append((w, i))
    return out


def _ref_variable_behind(index: GraphIndex, s: int, k: int) -> int | None:
    """The ref variable whose buffer tensor (s, k) aliases, if any (`w/read` Identities)."""
    seen = 0
    while seen < 8:
        if index.ops[s] in VARIABLE_OPS:
            dt = index.dtype((s, k))
            return s if dt is None or dtypes.is_ref(dt) else None
        if index.ops[s] not in ("Identity", "RefIdentity") or not index.data_inputs[s]:
            return None
        s, k = index.data_inputs[s][0]
        seen += 1
    return None


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class RecomputePass(Pass):
    """Copies of the forward ops between the policy's checkpoints, for the backward pass."""

    name, edits = "recompute", Edits.NODES

    def applies(self, context: PassContext) -> bool:
        return context.choice.policy != "none"  # the choice's: a budget search tries "none"

    def run(self, context: PassContext) -> RecomputePlan:
        return apply_recompute(context.index, context.original_regions, context.facts,
                               context.choice.tensors, context.options.batch_size,
                               context.choice.lead, context.choice.late_copies,
                               context.choice.weight_grads_first, context.choice.unled)
