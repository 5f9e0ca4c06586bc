"""The forward spine as a chain: where it can be cut, and what each cut costs.

The spine is the forward activation ops downstream of a parameter, in topological order.
For each position p it knows the saved-activation bytes made up to p (where a cut sits in
memory terms), the bytes of the tensors crossing a cut after p, the bottlenecks (cuts of
a single tensor, from the dominator tree) and how to name the tensors crossing any cuts.
Both the `memory` policy and the `budget` policy plan on this chain.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from graphmem.analysis.activations import ForwardFacts
from graphmem.analysis.dominators import bottlenecks
from graphmem.analysis.regions import Regions, SavedActivation
from graphmem.graph.index import GraphIndex, Tensor


@dataclass
class Spine:
    order: list[int]  # spine ops in topological order
    pos: dict[int, int]
    weight: list[int]  # saved-activation bytes placed at each position
    cumulative: list[int]
    cut_bytes: list[int]  # bytes crossing a cut right after each position
    bottleneck_at: dict[int, Tensor]  # position -> the single tensor crossing there
    saved: list[SavedActivation]  # recomputable saved activations
    crossing: Callable[[list[int]], list[Tensor]] = field(repr=False)

    @property
    def total(self) -> int:
        return self.cumulative[-1] if self.cumulative else 0

    @property
    def bottleneck_positions(self) -> list[int]:
        return sorted(self.bottleneck_at)


def analyze_spine(index: GraphIndex, regions: Regions, facts: ForwardFacts,
                  candidates: set[Tensor], batch_size: int | None) -> Spine:
    spine = facts.param_dependent
    order = [i for i in index.topo if i in spine]
    pos = {v: p for p, v in enumerate(order)}
    edges = [(s, i) for i in order for s, _ in index.data_inputs[i] if s in spine]
    sinks = [t[0] for t in regions.loss if t[0] in spine]
    if not sinks:
        has_succ = {a for a, _ in edges}
        sinks = [i for i in order if i not in has_succ]
    saved = [s for s in regions.saved if s.tensor[0] in facts.recomputable]
    # order is sorted by global position: a saved tensor off the spine is placed at the
    # last spine op before it
    weight = [0] * len(order)
    glob_pos = [index.position[v] for v in order]
    for s in saved:
        j = bisect_left(glob_pos, index.position[s.tensor[0]] + 1) - 1
        if j >= 0:
            weight[j] += s.bytes or 1
    cumulative, running = [], 0
    for w in weight:
        running += w
        cumulative.append(running)
    bottleneck_at: dict[int, Tensor] = {}
    for i in bottlenecks(order, edges, sinks) if sinks and order else []:
        outs = [t for t in index.outputs(i)
                if t in candidates and any(c in spine for c in index.consumers.get(t, ()))]
        if len(outs) == 1:
            bottleneck_at[pos[i]] = outs[0]
    cut_bytes, crossing = _cut_sweep(index, order, pos, spine, batch_size)
    return Spine(order, pos, weight, cumulative, cut_bytes, bottleneck_at, saved, crossing)


def _cut_sweep(index, order, pos, spine, batch_size):
    """Bytes crossing each cut of the spine order, and a function naming the tensors that
    cross given cuts. A cut after position p holds every spine tensor made at or before p
    and read after it; keeping those is enough to recompute what follows the cut."""
    last_read: dict[Tensor, int] = {}
    for v in order:
        for s, k in index.data_inputs[v]:
            if s in spine and last_read.get((s, k), -1) < pos[v]:
                last_read[(s, k)] = pos[v]
    delta = [0] * (len(order) + 1)
    for t, last in last_read.items():
        size = index.tensor_bytes(t, batch_size) or 1
        delta[pos[t[0]]] += size
        delta[last] -= size
    cut_bytes, running = [], 0
    for p in range(len(order)):
        running += delta[p]
        cut_bytes.append(running)

    def crossing(cuts: list[int]) -> list[Tensor]:
        cuts = sorted(cuts)
        out = []
        for t, last in last_read.items():
            j = bisect_left(cuts, pos[t[0]])  # first cut at or after the tensor is made
            if j < len(cuts) and cuts[j] < last:
                out.append(t)
        return out

    return cut_bytes, crossing
