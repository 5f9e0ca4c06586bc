"""Swap pass: move saved activations to host memory and back, Large Model Support style.

For each chosen forward tensor, a swap-out Identity on the host device copies it out right
after it is made (so the device buffer is freed after the forward pass's last reader), and a
swap-in Identity on the device brings it back for the backward ops that read it. A swap-in is
held back by a control edge from a trigger, a backward op that runs a chosen distance ahead of
the reader: found by LMS's chain rule (the gradient op of a forward op `d` steps after the
producer runs about `d` steps before the reader) or, failing that, by walking `d` steps up
from the reader ("direct order"). Triggers are ancestors of the reader, so no cycle can form.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field, replace

from graphmem.analysis.pruning import KEEP_ATTR  # Grappler keeps the swap ops marked with it
from graphmem.analysis.regions import Regions
from graphmem.errors import InputError, UsageError
from graphmem.graph.builders import identity_node
from graphmem.graph.devices import normalize_device
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex, Tensor
from graphmem.graph.names import input_string, is_copy, parse_input
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, skip
from graphmem.passes.recompute import NO_DATA_READERS

SWAP_SCOPE = "graphmem_swap"
DEFAULT_HOST = "/device:CPU:0"

# oneDNN (TensorFlow's default CPU kernels on x86) pairs these forward ops with their gradient
# through a hidden workspace when the gradient reads the forward output directly (TF's
# mkl_layout_pass: (forward op, gradient op) -> the gradient's input slot that must come
# straight from the forward op's output 0). An Identity in between breaks the pair: the
# gradient is then computed without the workspace, summing overlapping pooling windows in
# another order, and training moves by float rounding. Nothing would be saved anyway: the
# workspace, as large as the output, stays alive for the gradient.
WORKSPACE_PAIRS = {("MaxPool", "MaxPoolGrad"): 1, ("MaxPool3D", "MaxPool3DGrad"): 1,
                   ("LRN", "LRNGrad"): 2}


@dataclass
class SwapOptions:
    threshold: int = 0  # bytes; smaller tensors stay on the device
    max_tensors: int | None = None
    include: list[str] = field(default_factory=list)  # regexes on op names or types
    exclude: list[str] = field(default_factory=list)
    start: list[str] = field(default_factory=list)  # scopes/op names the forward walk starts at
    ahead: tuple[int, int] = (1, 10)  # trigger distance before the reader: lower, upper
    fuse: bool = False  # one swap-in per tensor for all its readers
    branches: bool = False  # also serve forward readers far from the producer
    branch_threshold: int = 20  # topological distance that makes a forward reader "far"
    device: str | None = None  # device whose memory is saved (default: the producer's)
    host: str = DEFAULT_HOST
    tensors: list[Tensor] | None = None  # swap exactly these (the hybrid with recompute)


@dataclass
class SwapPair:
    tensor: str
    bytes: int | None
    swap_out: str
    swap_in: str
    readers: list[str]
    trigger: str
    distance: int  # hops from the trigger up to the first reader
    how: str  # "chain rule" or "direct order"


@dataclass
class SwapPlan(PassPlan):
    pairs: list[SwapPair] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> tensors
    bytes_moved: int = 0  # per step: one copy out, one back in per swap-in

    @property
    def swapped_tensors(self) -> int:
        return len({p.tensor for p in self.pairs})

    @property
    def changed(self) -> bool:
        return bool(self.pairs)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(self.skipped)


def choose_swap_tensors(index: GraphIndex, regions: Regions, options: SwapOptions,
                        batch_size: int | None, plan: SwapPlan) -> list[Tensor]:
    """Saved activations worth swapping, earliest first (they wait longest for the
    backward pass), filtered by size, include/exclude patterns and the starting scope;
    apply_swap stops at --swap-max-tensors swapped."""
    if options.tensors is not None:
        return list(options.tensors)
    include = [re.compile(p) for p in options.include]
    exclude = [re.compile(p) for p in options.exclude]
    reachable = _forward_from_start(index, regions, options.start) if options.start else None
    chosen = []
    host = normalize_device(options.host)
    on_host = 0
    for s in sorted(regions.saved, key=lambda s: index.position[s.tensor[0]]):
        i = s.tensor[0]
        name, op = index.names[i], index.ops[i]
        if normalize_device(options.device or index.devices[i]) == host:
            on_host += 1  # a copy to the device it is on saves nothing
            skip(plan, "already on the host device")
            continue
        if reachable is not None and i not in reachable:
            skip(plan, "before the starting scope")
            continue
        if exclude and any(p.search(name) or p.search(op) for p in exclude):
            skip(plan, "excluded")
            continue
        if include and not any(p.search(name) or p.search(op) for p in include):
            skip(plan, "not included")
            continue
        if index.in_loop(i) or index.is_control_flow(i):
            skip(plan, "inside a loop")
            continue
        size = index.tensor_bytes(s.tensor, batch_size)
        if size is None:
            skip(plan, "unknown size")
            continue
        if size < options.threshold:
            skip(plan, "below --swap-threshold")
            continue
        chosen.append(s.tensor)
    if on_host and on_host == len(regions.saved):
        raise UsageError(f"--swap: every saved activation is already on the host device "
                         f"{options.host}; name the device to save with --device, or "
                         f"another --host-device")
    return chosen


def apply_swap(index: GraphIndex, regions: Regions, options: SwapOptions,
               batch_size: int | None) -> SwapPlan:
    """Choose the tensors (`choose_swap_tensors`) and swap them: rewrites
    index.graph_def in place; the index is stale afterwards."""
    plan = SwapPlan()
    tensors = choose_swap_tensors(index, regions, options, batch_size, plan)
    return _swap_tensors(index, regions, tensors, options, batch_size, plan)


def _swap_tensors(index: GraphIndex, regions: Regions, tensors: list[Tensor],
                  options: SwapOptions, batch_size: int | None, plan: SwapPlan) -> SwapPlan:
    g = index.graph_def
    new_nodes = []
    rewires: dict[int, dict[int, str]] = {}
    late = regions.backward | {i for i in range(len(index))
                               if is_copy(index.names[i])}
    for t in tensors:
        if options.max_tensors is not None and plan.swapped_tensors >= options.max_tensors:
            break
        readers = _late_readers(index, t, late, options)
        paired = [r for r in readers if _workspace_pair(index, t, r)]
        if paired:
            readers = [r for r in readers if r not in paired]
            if not readers:
                skip(plan, "read by its gradient through a oneDNN workspace")
                continue
        if not readers:
            skip(plan, "no reader after the forward pass")
            continue
        src = t[0]
        groups = [readers] if options.fuse else [[r] for r in readers]
        triggered = []
        for group in groups:
            first = min(group, key=index.position.__getitem__)
            trigger, distance, how = _trigger(index, late, src, first, options.ahead)
            if trigger is None:
                # nothing in the backward pass runs before this reader: it reads the tensor
                # right after the forward pass, so a swap would only add two copies
                skip(plan, "read at the start of the backward pass (no trigger)")
                continue
            triggered.append((group, trigger, distance, how))
        if not triggered:
            continue
        base = f"{SWAP_SCOPE}/{index.names[src]}_{t[1]}"
        device = options.device if options.device is not None else index.devices[src]
        out_node = _identity(f"{base}/out", input_string(index.names[src], t[1]),
                             options.host, index, t)
        new_nodes.append(out_node)
        size = index.tensor_bytes(t, batch_size)
        for n, (group, trigger, distance, how) in enumerate(triggered):
            in_node = _identity(f"{base}/in_{n}", out_node.name, device, index, t)
            in_node.input.append("^" + index.names[trigger])
            new_nodes.append(in_node)
            for r in group:
                for slot, text in enumerate(g.node[r].input):
                    name, k, ctrl = parse_input(text)
                    if not ctrl and index.id_of[name] == src and k == t[1]:
                        rewires.setdefault(r, {})[slot] = in_node.name
            plan.pairs.append(SwapPair(
                index.tensor_name(t), size, out_node.name, in_node.name,
                [index.names[r] for r in group], index.names[trigger], distance, how))
        plan.bytes_moved += (size or 0) * (1 + len(triggered))
    for r, slots in rewires.items():
        for slot, text in slots.items():
            g.node[r].input[slot] = text
    g.node.extend(new_nodes)
    return plan


def _identity(name: str, source: str, device: str, index: GraphIndex, t: Tensor):
    """A copy of tensor `t` on `device`, typed and shaped like it."""
    node = identity_node(name, [source], device, index.dtype(t), index.shape(t))
    node.attr[KEEP_ATTR].b = True
    return node


def _workspace_pair(index: GraphIndex, t: Tensor, reader: int) -> bool:
    """Does `reader` read `t` where oneDNN wants the forward op's output itself?"""
    slot = WORKSPACE_PAIRS.get((index.ops[t[0]], index.ops[reader]))
    if slot is None or t[1] != 0:
        return False
    inputs = index.graph_def.node[reader].input
    if slot >= len(inputs):
        return False
    name, k, ctrl = parse_input(inputs[slot])
    return not ctrl and k == 0 and index.id_of.get(name) == t[0]


def _late_readers(index: GraphIndex, t: Tensor, late: set[int],
                  options: SwapOptions) -> list[int]:
    """Readers of `t` that run after the forward pass (and, with --swap-branches, forward
    readers far enough from the producer)."""
    out = []
    for c in set(index.consumers.get(t, ())):
        if index.ops[c] in NO_DATA_READERS or index.ops[c] in SHAPE_ONLY_OPS:
            continue
        if index.in_loop(c):
            continue
        if c in late:
            out.append(c)
        elif options.branches and \
                index.position[c] - index.position[t[0]] > options.branch_threshold:
            out.append(c)
    return sorted(out, key=index.position.__getitem__)


def _trigger(index: GraphIndex, late: set[int], src: int, reader: int,
             ahead: tuple[int, int]) -> tuple[int | None, int | None, str]:
    lower, upper = ahead
    up = _levels_above(index, reader, late, upper)  # op -> hops above the reader
    if not up:
        return None, None, "none"
    # chain rule: gradient ops of forward ops d steps after the producer, d in [lower, upper]
    frontier, seen = [src], {src}
    for d in range(1, upper + 1):
        nxt = []
        for i in frontier:
            for c in index.data_consumers(i):
                if c in seen or c in late:
                    continue
                seen.add(c)
                nxt.append(c)
        if d >= lower:
            hits = [c for i in nxt for c in index.data_consumers(i)
                    if c in up and up[c] >= lower and _can_trigger(index, c)]
            if hits:
                best = min(hits, key=lambda b: (up[b], -index.position[b]))
                return best, up[best], "chain rule"
        frontier = nxt
        if not frontier:
            break
    # direct order: the op `lower` hops above the reader, or the farthest one found
    candidates = [b for b, h in up.items() if h >= lower and _can_trigger(index, b)]
    if not candidates:
        candidates = [b for b in up if _can_trigger(index, b)]
        if not candidates:
            return None, None, "none"
    best = min(candidates, key=lambda b: (abs(up[b] - lower), -index.position[b]))
    return best, up[best], "direct order"


def _can_trigger(index: GraphIndex, i: int) -> bool:
    """Outside loop frames and conditional branches: a control edge from an op in a branch
    not taken would make the swap-in, and its readers, dead."""
    return not index.in_loop(i) and not index.may_be_dead(i)


def _levels_above(index: GraphIndex, reader: int, late: set[int], limit: int) -> dict[int, int]:
    """Backward ops above `reader`, by the fewest hops (data and control) that reach it."""
    levels: dict[int, int] = {}
    queue = deque([(reader, 0)])
    seen = {reader}
    while queue:
        i, h = queue.popleft()
        if h == limit:
            continue
        for s in [s for s, _ in index.data_inputs[i]] + index.control_inputs[i]:
            if s in seen or s not in late:
                continue
            seen.add(s)
            levels[s] = h + 1
            queue.append((s, h + 1))
    return levels


def _forward_from_start(index: GraphIndex, regions: Regions, start: list[str]) -> set[int]:
    patterns = [re.compile("^" + p) for p in start]
    seeds = [i for i in regions.forward if any(p.search(index.names[i]) for p in patterns)]
    if not seeds:
        raise InputError(f"--swap-start matches no forward op: {', '.join(start)}")
    return index.descendants(seeds) & regions.forward


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class SwapPass(Pass):
    """Host offload of saved activations, or of the checkpoints a recompute policy kept."""

    name, edits = "swap", Edits.NODES

    def enabled(self, options) -> bool:
        return options.swap is not None

    def run(self, context: PassContext) -> SwapPlan:
        options = context.options.swap
        if context.choice.policy != "none":  # swap what the policy kept
            options = replace(options, tensors=context.kept_tensors())
        return apply_swap(context.index, context.regions, options, context.options.batch_size)
