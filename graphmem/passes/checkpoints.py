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
from dataclasses import dataclass, field

from graphmem.analysis.activations import ForwardFacts
from graphmem.analysis.dominators import bottlenecks
from graphmem.analysis.regions import Regions
from graphmem.errors import InputError, UsageError
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex, Tensor, nbytes

POLICIES = ("memory", "speed", "collection", "names", "none")
EXPENSIVE_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                           "Conv2D", "Conv3D", "Conv1D", "DepthwiseConv2dNative",
                           "Conv2DBackpropInput", "Conv3DBackpropInputV2", "_FusedMatMul",
                           "_FusedConv2D", "_FusedBatchMatMul", "Einsum", "SparseMatMul",
                           "_MklMatMul", "_MklConv2D"})


@dataclass
class CheckpointChoice:
    policy: str
    tensors: list[Tensor]
    note: str = ""  # how the choice was made, e.g. a fallback
    candidates: int = 0
    bottlenecks: int = 0
    fallback: bool = False
    unmatched: list[str] = field(default_factory=list)


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
        return CheckpointChoice("speed", picks, "outputs of matmuls and convolutions",
                                len(candidates))
    if policy == "collection":
        return _from_collection(index, candidates, collection)
    if policy == "names":
        return _from_patterns(index, candidates, patterns or [])
    if policy == "memory":
        return _memory_policy(index, regions, facts, candidates, batch_size)
    raise UsageError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")


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


def _memory_policy(index, regions, facts, candidates, batch_size) -> CheckpointChoice:
    spine = facts.param_dependent
    sinks = [t[0] for t in regions.loss if t[0] in spine]
    order = [i for i in index.topo if i in spine]
    edges = [(s, i) for i in order for s, _ in index.data_inputs[i] if s in spine]
    if not sinks:
        has_succ = {a for a, _ in edges}
        sinks = [i for i in order if i not in has_succ]
    saved = [s for s in regions.saved if s.tensor[0] in facts.recomputable]
    n_saved = max(len(saved), 1)
    want = max(1, math.ceil(math.sqrt(n_saved)))
    cand_set = set(candidates)
    found = bottlenecks(order, edges, sinks) if order and sinks else []
    bottleneck_ts = []
    for i in found:
        outs = [t for t in index.outputs(i) if t in cand_set and
                any(c in spine for c in index.consumers.get(t, ()))]
        if len(outs) == 1:
            bottleneck_ts.append(outs[0])
    weights = {s.tensor: s.bytes or 0 for s in saved}
    if len(bottleneck_ts) >= want:
        picks = _spaced(index, bottleneck_ts, want, saved, weights)
        return CheckpointChoice("memory", picks,
                                f"{len(picks)} of {len(bottleneck_ts)} bottlenecks, spaced "
                                "by bytes", len(candidates), len(bottleneck_ts))
    picks = _cheapest_cuts(index, order, spine, cand_set, want, saved, batch_size)
    return CheckpointChoice(
        "memory", picks,
        f"fallback: found {len(bottleneck_ts)} bottlenecks, wanted {want}; kept the tensors "
        f"crossing the {want} cheapest topological cuts instead", len(candidates),
        len(bottleneck_ts), fallback=True)


def _spaced(index, pool: list[Tensor], want: int, saved, weights) -> list[Tensor]:
    """`want` tensors from `pool` near the byte quantiles of the saved activations."""
    ordered_saved = sorted(saved, key=lambda s: index.position[s.tensor[0]])
    positions, cumulative, total = [], [], 0
    for s in ordered_saved:
        total += weights.get(s.tensor, 0)
        positions.append(index.position[s.tensor[0]])
        cumulative.append(total)
    pool = sorted(pool, key=lambda t: index.position[t[0]])
    if not total or len(pool) <= want:
        step = max(1, len(pool) // (want + 1))
        return pool[step - 1::step][:want] if len(pool) > want else pool

    def bytes_before(t: Tensor) -> int:
        j = bisect_left(positions, index.position[t[0]] + 1) - 1
        return cumulative[j] if j >= 0 else 0

    at = [bytes_before(t) for t in pool]
    picks: list[Tensor] = []
    for q in range(1, want + 1):
        target = total * q / (want + 1)
        j = min(range(len(pool)), key=lambda m: abs(at[m] - target))
        if pool[j] not in picks:
            picks.append(pool[j])
    return sorted(picks, key=lambda t: index.position[t[0]])


def _cheapest_cuts(index, order, spine, cand_set, want, saved, batch_size) -> list[Tensor]:
    """Tensors crossing the `want` cheapest cuts of the spine's topological order, one cut
    per equal slice of it. A cut at position p holds every spine tensor made at or before p
    and read after it; keeping those is enough to recompute everything after the cut."""
    pos = {v: p for p, v in enumerate(order)}
    last_read: dict[Tensor, int] = {}
    for v in order:
        for s, k in index.data_inputs[v]:
            if s in spine:
                last_read[(s, k)] = max(last_read.get((s, k), -1), pos[v])
    size = {t: nbytes(index.shape(t), index.dtype(t), batch_size) or 1 for t in last_read}
    delta = [0] * (len(order) + 1)
    for t, last in last_read.items():
        delta[pos[t[0]]] += size[t]
        delta[last] -= size[t]
    cut_bytes, running = [], 0
    for p in range(len(order)):
        running += delta[p]
        cut_bytes.append(running)
    n = len(order)
    cuts = []
    for q in range(want):
        hi = n * (q + 1) // (want + 1)
        lo = max(hi - n // (2 * (want + 1)), 0)
        hi = min(max(hi, lo + 1), n)
        cuts.append(min(range(lo, hi), key=cut_bytes.__getitem__))
    cuts.sort()
    picks = []
    for t, last in last_read.items():
        j = bisect_left(cuts, pos[t[0]])  # first cut at or after the tensor is made
        if j < len(cuts) and cuts[j] < last and t in cand_set:
            picks.append(t)
    return sorted(picks, key=lambda t: (index.position[t[0]], t[1]))
