"""`graphmem plan`: the trade-off between peak memory and extra compute for one model.

Points of the curve come from the budget model (no rewrite per point, so it is quick on big
graphs); the `memory` and `speed` policies are placed on it by rewriting and estimating, with
their extra compute counted from the ops they copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.cost import op_flops
from graphmem.analysis.regions import analyze_regions
from graphmem.analysis.spine import analyze_spine
from graphmem.estimate import estimate_step
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.budget import build_units, solve_budget
from graphmem.passes.checkpoints import candidate_tensors
from graphmem.passes.recompute import COPY_SCOPE
from graphmem.rewrite import RewriteOptions, early_updates_peak, rewrite_workspace


@dataclass
class TradeoffPoint:
    label: str
    peak_bytes: int
    extra_flops_share: float  # extra forward FLOPs / forward FLOPs of the spine
    how: str  # "model" or "estimate"


@dataclass
class Tradeoff:
    original_peak_bytes: int
    forward_flops: int
    early_updates_peak_bytes: int  # no recompute, early updates only: the curve's top
    points: list[TradeoffPoint] = field(default_factory=list)
    policies: list[TradeoffPoint] = field(default_factory=list)


def tradeoff(path, batch_size: int | None, fmt=None, tag=None, function=None,
             steps: int = 8) -> Tradeoff:
    ws = Workspace.open(load_model(path, fmt, tag, function), batch_size=batch_size)
    index = ws.index
    regions = analyze_regions(index, None, batch_size, ws.collection("losses"))
    if ws.refine_shapes(regions.step_nodes(index), batch_size):
        regions = analyze_regions(index, None, batch_size, ws.collection("losses"))
    facts = analyze_forward(index, regions)
    original = estimate_step(ws, regions, batch_size).peak_bytes
    spine = analyze_spine(index, regions, facts, set(candidate_tensors(index, regions, facts)),
                          batch_size)
    units = build_units(index, spine, batch_size)
    # no recompute still has the early-updates pass, which rewrites run by default: the
    # model's base is that graph's peak (see rewrite_workspace)
    # (this edits ws, which is not used afterwards: each policy opens its own)
    no_recompute = early_updates_peak(ws, index, regions, facts,
                                      RewriteOptions("none", [], batch_size))
    base = max(no_recompute - sum(units.act), 0)
    total = sum(units.flops) or 1
    result = Tradeoff(original, total, no_recompute)
    low = solve_budget(units, base, 0).min_peak
    for k in range(steps):
        budget = int(low + (original - low) * k / max(steps - 1, 1))
        sol = solve_budget(units, base, budget)
        if sol.feasible:
            result.points.append(TradeoffPoint(f"budget {budget / original:.2f}",
                                               sol.model_peak, sol.extra_flops / total,
                                               "model"))
    for policy in ("memory", "speed"):
        ws_p = Workspace.open(load_model(path, fmt, tag, function), batch_size=batch_size)
        res = rewrite_workspace(ws_p, RewriteOptions(policy, [], batch_size, keep_worse=True))
        new = ws_p.index
        extra = sum(op_flops(new, i, batch_size) for i in range(len(new))
                    if new.names[i].startswith(COPY_SCOPE + "/"))
        result.policies.append(TradeoffPoint(policy, res.after.peak_bytes, extra / total,
                                             "estimate"))
    return result
