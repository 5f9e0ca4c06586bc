"""Checkpoint policies: which forward tensors stay alive until the backward pass.

Every policy picks among the same candidates, the outputs of recomputable activation ops
other than the loss; whatever is not recomputable is kept anyway and is never a pick.
  memory      bottlenecks of the forward pass, about sqrt(N) of them, spaced by bytes;
              with too few bottlenecks (long skips), cheapest topological cuts instead
  speed       outputs of the expensive ops (matmuls, convolutions and their fused forms)
  collection  the tensors of the MetaGraphDef collection `checkpoints`
  names       tensors matching --checkpoints patterns (name fragment or regex)
  none        no recompute
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from dataclasses import dataclass, field, replace

from graphmem.analysis.activations import ForwardFacts
from graphmem.analysis.op_classes import EXPENSIVE_OPS
from graphmem.analysis.regions import Regions
from graphmem.analysis.spine import analyze_spine
from graphmem.analysis.towers import find_towers, tower_of
from graphmem.errors import InputError, UsageError
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex, Tensor

POLICIES = ("memory", "speed", "collection", "names", "budget", "none")


@dataclass
class CheckpointChoice:
    policy: str
    tensors: list[Tensor]
    note: str = ""  # how the choice was made, e.g. a fallback
    candidates: int = 0
    bottlenecks: int = 0
    fallback: bool = False
    unmatched: list[str] = field(default_factory=list)
    # each segment held back one segment ahead (recompute.py, _lead_triggers): its
    # recomputation overlaps the next segment's gradient ops, which is faster with several
    # inter-op threads but keeps two segments' values alive at once; False: each segment
    # waits for its own readers' inputs (the memory policy tries both)
    lead: bool = True
    # with `lead`: segments that wait for their own readers all the same (the memory
    # policy's partial lead: those whose copies a lead kept alive at the estimated peak)
    unled: tuple[int, ...] = ()
    # cheap targets the rest of their segment is recomputed from get a second copy for
    # their own backward readers (recompute.py, _late_targets; the memory policy tries it)
    late_copies: bool = False
    # with late copies: a weight gradient reading a late target gets a copy of its own and
    # runs before the input gradient beside it (recompute.py, _readers_first; the memory
    # policy keeps it where it lowers the estimate)
    weight_grads_first: bool = True


def candidate_tensors(index: GraphIndex, regions: Regions, facts: ForwardFacts) -> list[Tensor]:
    loss = set(regions.loss)
    out = []
    for i in sorted(facts.recomputable, key=index.position.__getitem__):
        for k in range(index.num_outputs[i]):
            t = (i, k)
            if t in loss:
                continue
            readers = index.consumers.get(t, ())
            if any(index.ops[r] not in SHAPE_ONLY_OPS for r in readers):
                out.append(t)
    return out


def choose_checkpoints(policy: str, index: GraphIndex, regions: Regions, facts: ForwardFacts,
                       batch_size: int | None, patterns: list[str] | None = None,
                       collection: list[str] | None = None) -> CheckpointChoice:
    if patterns and policy not in ("names", "memory"):
        raise UsageError("--checkpoints names tensors to keep; use it with --policy names")
    if patterns:
        policy = "names"
    candidates = candidate_tensors(index, regions, facts)
    if policy == "none":
        return CheckpointChoice("none", [], "no recompute", len(candidates))
    if policy == "speed":
        picks = [t for t in candidates if t[1] == 0 and index.ops[t[0]] in EXPENSIVE_OPS]
        return CheckpointChoice("speed", past_bias(index, picks, candidates),
                                "outputs of matmuls and convolutions", len(candidates))
    if policy == "collection":
        return _from_collection(index, candidates, collection)
    if policy == "names":
        return _from_patterns(index, candidates, patterns or [])
    if policy == "memory":
        towers = find_towers(index, facts.recomputable)
        choice = _memory_policy_per_tower(index, regions, facts, candidates, batch_size,
                                          towers.devices) if towers.several else \
            _memory_policy(index, regions, facts, candidates, batch_size)
        choice.tensors = past_bias(index, choice.tensors, candidates)
        return choice
    raise UsageError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")


def keep_top_segment(index: GraphIndex, regions: Regions, picks: list[Tensor],
                     candidates: list[Tensor]) -> list[Tensor]:
    """`picks` plus every saved activation made after the last of them: the top segment
    kept instead of recomputed. The backward pass starts at the top, so the top segment's
    activations are live at its start whether they were kept or just recomputed: keeping
    them costs about no memory and saves recomputing one segment (the loss's own
    temporaries, computed while they are kept, are what it can cost)."""
    if not picks:
        return picks
    allowed = set(candidates)
    kept = set(picks)
    # with several towers (towers.py) each tower's backward pass starts at its own top
    several = find_towers(index, {t[0] for t in candidates}).several
    last: dict[str, int] = {}
    for t in picks:
        tower = tower_of(index, t[0]) if several else ""
        last[tower] = max(last.get(tower, -1), index.position[t[0]])
    top = [s.tensor for s in regions.saved if s.tensor in allowed and s.tensor not in kept
           and index.position[s.tensor[0]] > last.get(
               tower_of(index, s.tensor[0]) if several else "", len(index))]
    return picks + sorted(set(top), key=lambda t: (index.position[t[0]], t[1]))


BIAS_OPS = frozenset({"BiasAdd", "BiasAddV1"})


def past_bias(index: GraphIndex, picks: list[Tensor], candidates: list[Tensor]) -> list[Tensor]:
    """Keep a matmul's or convolution's output after its bias: a pick whose only reader is
    a BiasAdd becomes that BiasAdd's output (same size). Kept before the bias, the copies
    re-add it and the product gets a second reader, which stops TF from fusing the product
    with its bias (oneDNN's layout pass, Grappler's remapper): fused, float16 and bfloat16
    round once, unfused twice, and the rewritten graph trained differently (a Keras
    mixed-precision CNN)."""
    allowed = set(candidates)
    out: list[Tensor] = []
    seen: set[Tensor] = set()
    for t in picks:
        readers = index.consumers.get(t, ())
        if t[1] == 0 and index.ops[t[0]] in EXPENSIVE_OPS and len(readers) == 1 \
                and index.ops[readers[0]] in BIAS_OPS and (readers[0], 0) in allowed:
            t = (readers[0], 0)
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _from_collection(index, candidates, collection) -> CheckpointChoice:
    if not collection:
        raise InputError("the model has no `checkpoints` collection (or it is empty); "
                         "pick another --policy or name tensors with --checkpoints")
    wanted = {c if ":" in c else c + ":0" for c in collection}
    picks = [t for t in candidates if index.tensor_name(t) in wanted]
    missing = sorted(wanted - {index.tensor_name(t) for t in picks})
    return CheckpointChoice("collection", picks, "the `checkpoints` collection",
                            len(candidates), unmatched=missing)


def _from_patterns(index, candidates, patterns) -> CheckpointChoice:
    picks: list[Tensor] = []
    unmatched = []
    for pat in patterns:
        try:
            rx = re.compile(pat)
        except re.error:
            rx = re.compile(re.escape(pat))
        hits = [t for t in candidates
                if pat in index.tensor_name(t) or rx.search(index.tensor_name(t))]
        if not hits:
            unmatched.append(pat)
        picks.extend(h for h in hits if h not in picks)
    if unmatched:
        raise InputError("--checkpoints pattern(s) matched no recomputable forward tensor: "
                         + ", ".join(repr(p) for p in unmatched))
    picks.sort(key=lambda t: index.position[t[0]])
    return CheckpointChoice("names", picks, "tensors named by --checkpoints", len(candidates))


def _memory_policy_per_tower(index, regions, facts, candidates, batch_size,
                             devices: list[str]) -> CheckpointChoice:
    """The memory policy run on each tower's own spine (its device's ops): towers run side
    by side, each a chain of its own, and one spine over all of them has no bottleneck
    (every cut crosses every tower)."""
    by_tower: dict[str, list[Tensor]] = {d: [] for d in devices}
    for t in candidates:
        tower = tower_of(index, t[0])
        if tower in by_tower:
            by_tower[tower].append(t)
    picks: list[Tensor] = []
    notes, bottlenecks, fallback = [], 0, False
    joined = _joining_towers(index, facts.param_dependent)
    for device in devices:
        own = {i for i in facts.recomputable if tower_of(index, i) == device} - joined
        sub = replace(facts, param_dependent={i for i in facts.param_dependent if i in own},
                      recomputable=own)
        choice = _memory_policy(index, regions, sub, by_tower[device], batch_size)
        picks.extend(choice.tensors)
        notes.append(f"{device}: {choice.note}")
        bottlenecks += choice.bottlenecks
        fallback = fallback or choice.fallback
    picks.sort(key=lambda t: (index.position[t[0]], t[1]))
    return CheckpointChoice("memory", picks, f"per tower ({'; '.join(notes)})",
                            len(candidates), bottlenecks, fallback=fallback)


def _joining_towers(index: GraphIndex, spine: set[int]) -> set[int]:
    """Spine ops that read spine ops of several devices (the total loss, `add_n` of the
    towers' losses on the parameter device), and those after them: in no tower's own
    chain. A split of the batch that feeds every tower is read by each from one device
    and joins nothing. One walk in topological order."""
    joined: set[int] = set()
    for i in index.topo:
        if i not in spine:
            continue
        ins = [s for s, _ in index.data_inputs[i] if s in spine]
        if any(s in joined for s in ins) or len({tower_of(index, s) for s in ins}) > 1:
            joined.add(i)
    return joined


def _memory_policy(index, regions, facts, candidates, batch_size) -> CheckpointChoice:
    """About sqrt(N) cuts of the forward spine, at equal steps of saved bytes.

    At each step, a bottleneck near the target is the cut (one tensor to keep); where the
    window holds none (a long skip connection jumps over it), the cheapest topological cut
    in the window is taken instead, keeping every tensor that crosses it.
    """
    cand_set = set(candidates)
    spine = analyze_spine(index, regions, facts, cand_set, batch_size)
    if not spine.order:
        return CheckpointChoice("memory", [], "no recomputable forward spine", len(candidates))
    want = max(1, math.ceil(math.sqrt(max(len(spine.saved), 1))))
    total, cumulative = spine.total, spine.cumulative
    bottleneck_positions = spine.bottleneck_positions
    picks: list[Tensor] = []
    cut_positions: list[int] = []
    used_bottlenecks = 0
    half = total / (2 * (want + 1))
    for q in range(1, want + 1):
        target = total * q / (want + 1)
        lo = bisect_left(cumulative, target - half)
        hi = min(bisect_left(cumulative, target + half), len(spine.order) - 1)
        if lo > hi:
            continue
        b_lo, b_hi = bisect_left(bottleneck_positions, lo), bisect_left(bottleneck_positions, hi + 1)
        if b_lo < b_hi:
            p = min(bottleneck_positions[b_lo:b_hi], key=lambda x: abs(cumulative[x] - target))
            if spine.bottleneck_at[p] not in picks:
                picks.append(spine.bottleneck_at[p])
                used_bottlenecks += 1
        else:
            cut_positions.append(min(range(lo, hi + 1), key=spine.cut_bytes.__getitem__))
    picks.extend(t for t in spine.crossing(cut_positions) if t in cand_set and t not in picks)
    picks.sort(key=lambda t: (index.position[t[0]], t[1]))
    fallback = bool(cut_positions)
    note = (f"{used_bottlenecks} of {len(spine.bottleneck_at)} bottlenecks, spaced by bytes"
            if not fallback else
            f"fallback for long skips: {used_bottlenecks} bottlenecks and {len(cut_positions)} "
            f"cheapest topological cuts ({len(picks) - used_bottlenecks} tensors crossing "
            "them), spaced by bytes")
    return CheckpointChoice("memory", picks, note, len(candidates), len(spine.bottleneck_at),
                            fallback=fallback)
