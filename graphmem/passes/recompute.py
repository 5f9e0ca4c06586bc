"""Recompute pass: keep only checkpoints alive until the backward pass, recompute the rest.

For each segment (the forward ops after one checkpoint and up to the next), the ops that the
backward pass needs from it are copied, reading checkpoints and kept tensors at the
segment's boundary; the backward ops that read those activations are pointed at the copies.
The copies are held back by control edges from triggers: the backward ops that feed the
segment's backward consumers and do not depend on them, i.e. the gradient arriving from the
later segments. A trigger never depends on the copies it holds back; it may depend on another
group's, and where two groups would wait for each other that way, the groups involved are
left without triggers (`_groups_closing_cycles`), so no cycle can form.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

from graphmem.analysis.activations import ForwardFacts
from graphmem.analysis.regions import Regions, is_state_write
from graphmem.graph import dtypes
from graphmem.graph.index import SHAPE_ONLY_OPS, VARIABLE_OPS, GraphIndex, Tensor
from graphmem.graph.names import input_string, parse_input

COPY_SCOPE = "graphmem_recompute"
# how many segments back a segment's copies may reach for ops that are not kept (see
# _independent_groups): enough for a transformer block's chains, linear on any graph
REACH_SEGMENTS = 16
# read only their input's shape and dtype: leave them on the original tensor
NO_DATA_READERS = SHAPE_ONLY_OPS | {"ZerosLike", "OnesLike"}


def original_name(name: str) -> str:
    """The op a recompute copy was made from (the name itself for any other op)."""
    if name.startswith(COPY_SCOPE + "/"):
        return name.split("/", 2)[2]
    return name


@dataclass
class Segment:
    index: int
    checkpoint: str | None  # the checkpoint the segment starts after (None: the first one)
    targets: list[str]  # activations recomputed for the backward pass
    copied_ops: int
    triggers: list[str]


@dataclass
class RecomputePlan:
    segments: list[Segment] = field(default_factory=list)
    copied_ops: int = 0
    rewired_inputs: int = 0
    kept_blocked: dict[str, int] = field(default_factory=dict)  # why -> saved tensors kept
    not_held_back: list[int] = field(default_factory=list)  # segments without a trigger
    update_guards: int = 0  # control edges that keep ref-variable writes after their copies
    cycle_breaks: int = 0  # groups left without triggers: theirs would have closed a cycle


def apply_recompute(index: GraphIndex, regions: Regions, facts: ForwardFacts,
                    checkpoints: list[Tensor]) -> RecomputePlan:
    """Rewrite index.graph_def in place. The index is stale afterwards; rebuild it."""
    plan = RecomputePlan()
    keep = set(checkpoints)
    recomputable = facts.recomputable
    for s in regions.saved:
        i = s.tensor[0]
        if i not in recomputable and i in facts.blocked:
            why = facts.blocked[i]
            plan.kept_blocked[why] = plan.kept_blocked.get(why, 0) + 1
    targets = [s for s in regions.saved
               if s.tensor[0] in recomputable and s.tensor not in keep]
    if not targets:
        return plan
    cut_positions = sorted(index.position[t[0]] for t in checkpoints)
    cut_names = {index.position[t[0]]: index.tensor_name(t) for t in checkpoints}
    by_segment: dict[int, list] = {}
    for s in targets:
        seg = bisect_right(cut_positions, index.position[s.tensor[0]])
        by_segment.setdefault(seg, []).append(s)
    g = index.graph_def
    new_nodes = []
    rewires: dict[int, dict[int, str]] = {}  # consumer -> input slot -> new input
    groups: list[_Group] = []
    for seg in sorted(by_segment):
        start = cut_positions[seg - 1 - REACH_SEGMENTS] if seg > REACH_SEGMENTS else -1
        for group_targets, needed in _independent_groups(index, by_segment[seg], keep,
                                                         recomputable, start):
            copy_name = {i: f"{COPY_SCOPE}/s{seg}/{index.names[i]}" for i in needed}
            consumers = _rewire(index, group_targets, copy_name, rewires)
            triggers = _triggers(index, regions, consumers) if consumers else set()
            groups.append(_Group(seg, group_targets, needed, copy_name, consumers, triggers))
    for k in _groups_closing_cycles(index, groups, rewires):
        groups[k].triggers = set()  # not held back rather than a cycle
        plan.cycle_breaks += 1
    for grp in groups:
        copy_name, triggers = grp.copy_name, grp.triggers
        copied = [_copy_node(index, i, copy_name)
                  for i in sorted(grp.needed, key=index.position.__getitem__)]
        copies = set(copy_name.values())
        for node in copied:
            if not any(parse_input(x)[0] in copies for x in node.input):
                node.input.extend("^" + index.names[t] for t in sorted(triggers))
        new_nodes.extend(copied)
        if not triggers:
            plan.not_held_back.append(grp.seg)
        plan.update_guards += _guard_ref_updates(index, regions, grp.needed, copy_name)
        start = cut_positions[grp.seg - 1] if grp.seg > 0 else None
        plan.segments.append(Segment(
            grp.seg, cut_names.get(start) if start is not None else None,
            [s.name for s in grp.targets], len(grp.needed),
            [index.names[t] for t in sorted(triggers)]))
        plan.copied_ops += len(grp.needed)
    for c, slots in rewires.items():
        node = g.node[c]
        for slot, text in slots.items():
            node.input[slot] = text
            plan.rewired_inputs += 1
    g.node.extend(new_nodes)
    return plan


@dataclass
class _Group:
    """One group of copies: made for `targets`, read by `consumers`, held back by
    `triggers`."""

    seg: int
    targets: list
    needed: set[int]  # ops copied
    copy_name: dict[int, str]
    consumers: set[int]
    triggers: set[int]


def _groups_closing_cycles(index: GraphIndex, groups: list[_Group],
                           rewires: dict[int, dict[int, str]]) -> list[int]:
    """Groups whose trigger edges take part in a cycle of the rewritten graph.

    Each group's triggers are chosen so that they do not depend on its own consumers, but a
    trigger may depend on another group's consumers: when two groups' consumers are
    siblings (both fed by one gradient, as the two branches of a custom-gradient swish),
    each can be the other's trigger, and the copies wait for each other. Cheap test first:
    when every group's triggers come before all its consumers in the original order, the
    copies can be placed between the two and every edge runs forward. Otherwise one Kahn
    pass over the rewritten graph (copies included) finds the ops left waiting; every cycle
    runs through a trigger edge (without them the copies only read forward ops), so the
    groups with a trigger edge between two waiting ops lose their triggers, and the pass
    repeats until nothing waits."""
    position = index.position
    suspects = [k for k, grp in enumerate(groups) if grp.triggers and grp.consumers and
                max(position[t] for t in grp.triggers) >=
                min(position[c] for c in grp.consumers)]
    if not suspects:
        return []
    n, ops = len(index), index.ops
    copy_id: dict[str, int] = {}
    owner: list[int] = []  # copy -> its group
    for k, grp in enumerate(groups):
        for i in sorted(grp.needed):
            copy_id[grp.copy_name[i]] = n + len(owner)
            owner.append(k)
    preds: list[list[int]] = []  # of each copy, triggers apart: its original's inputs,
    for grp in groups:  # copies of the same group where there is one
        for i in sorted(grp.needed):
            ins = [s for s, _ in index.data_inputs[i]] + index.control_inputs[i]
            preds.append([copy_id[grp.copy_name[j]] if j in grp.copy_name else j
                          for j in ins])
    original: list[list[int]] = []  # data inputs (reads of copies where rewired) + control
    for i in range(n):
        if ops[i] in ("Merge", "RefMerge"):  # loop back edges, as the index ignores them
            data = [s for s, _ in index.data_inputs[i]
                    if ops[s] not in ("NextIteration", "RefNextIteration")]
        else:
            data = [s for s, _ in index.data_inputs[i]]
        for slot, text in rewires.get(i, {}).items():
            if slot < len(data):
                data[slot] = copy_id[parse_input(text)[0]]
        original.append(data + index.control_inputs[i])
    dropped: set[int] = set()
    while True:
        total = n + len(owner)
        succ: list[list[int]] = [[] for _ in range(total)]
        indeg = [0] * total
        for i in range(n):
            for s in original[i]:
                succ[s].append(i)
            indeg[i] = len(original[i])
        for c, k in enumerate(owner):
            extra = () if k in dropped else groups[k].triggers
            for s in (*preds[c], *extra):
                succ[s].append(n + c)
                indeg[n + c] += 1
        stack = [i for i in range(total) if indeg[i] == 0]
        while stack:
            i = stack.pop()
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    stack.append(j)
        culprits = {k for c, k in enumerate(owner) if indeg[n + c] > 0 and k not in dropped
                    and any(indeg[t] > 0 for t in groups[k].triggers)}
        if not culprits:
            return sorted(dropped)
        dropped |= culprits


def _independent_groups(index: GraphIndex, targets: list, keep: set[Tensor],
                        recomputable: set[int], start: int) -> list[tuple[list, set[int]]]:
    """Split a segment's targets into groups whose copies share no op, so that each group
    is held back by the backward ops that need it, not by those of an unrelated branch.

    Copies reach back to kept tensors, and no further than `start` (a topological position,
    REACH_SEGMENTS segments back): an op before it is read as it is, which keeps its output
    alive like a checkpoint. Without that bound, checkpoints that do not cut the graph (the
    speed policy keeps matmul outputs; a residual chain's adds go around them) would make
    every segment copy the whole chain before it, quadratic in the depth."""
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
                if src in recomputable and (src, k) not in keep and position[src] > start:
                    stack.append(src)
    groups: dict[int, tuple[list, set[int]]] = {}
    for t_id, s in enumerate(targets):
        groups.setdefault(find(t_id), ([], set()))[0].append(s)
    for i, t_id in owner.items():
        groups[find(t_id)][1].add(i)
    return [groups[k] for k in sorted(groups)]


def _rewire(index: GraphIndex, targets: list, copy_name: dict[int, str],
            rewires: dict[int, dict[int, str]]) -> set[int]:
    """Point the targets' backward readers at the copies; returns those readers."""
    g = index.graph_def
    consumers: set[int] = set()
    for s in targets:
        new_input = input_string(copy_name[s.tensor[0]], s.tensor[1])
        for c in s.consumers:
            if index.ops[c] in NO_DATA_READERS:
                continue
            for slot, text in enumerate(g.node[c].input):
                name, k, ctrl = parse_input(text)
                if not ctrl and index.id_of[name] == s.tensor[0] and k == s.tensor[1]:
                    rewires.setdefault(c, {})[slot] = new_input
                    consumers.add(c)
    return consumers


def _copy_node(index: GraphIndex, i: int, copy_name: dict[int, str]):
    node = index.graph_def.node[i].__class__()
    node.CopyFrom(index.graph_def.node[i])
    node.name = copy_name[i]
    del node.input[:]
    for text in index.graph_def.node[i].input:
        name, k, ctrl = parse_input(text)
        j = index.id_of[name]
        if j in copy_name:
            node.input.append("^" + copy_name[j] if ctrl else input_string(copy_name[j], k))
        else:
            node.input.append(text)
    return node


def _triggers(index: GraphIndex, regions: Regions, consumers: set[int]) -> set[int]:
    """The nearest backward ancestors of `consumers` that do not depend on them.

    Walking up from the consumers, a backward op that depends on a consumer is passed
    through; the first ones that do not are the triggers. Only ops placed before the last
    consumer can be ancestors, which bounds both walks.
    """
    backward = regions.backward
    horizon = max(index.position[c] for c in consumers)
    downstream = set(consumers)
    queue = deque(consumers)
    while queue:
        i = queue.popleft()
        for j in index.data_consumers(i) + index.control_consumers[i]:
            if j not in downstream and index.position[j] <= horizon:
                downstream.add(j)
                queue.append(j)
    triggers: set[int] = set()
    seen = set(consumers)
    queue = deque(consumers)
    while queue:
        i = queue.popleft()
        for s, _ in index.data_inputs[i]:
            if s in seen or s not in backward or index.in_loop(s):
                continue  # an op inside a loop frame cannot hold back one outside it
            seen.add(s)
            if s in downstream:
                queue.append(s)
            else:
                triggers.add(s)
    return triggers


def _guard_ref_updates(index: GraphIndex, regions: Regions, needed: set[int],
                       copy_name: dict[int, str]) -> int:
    """A copy reading a ref variable's value must run before the optimizer writes it."""
    added = 0
    g = index.graph_def
    for i in needed:
        for s, k in index.data_inputs[i]:
            var = _ref_variable_behind(index, s, k)
            if var is None:
                continue
            for w in index.data_consumers(var):
                if is_state_write(index.ops[w]) and w in regions.optimizer:
                    g.node[w].input.append("^" + copy_name[i])
                    added += 1
    return added


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
