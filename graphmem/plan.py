"""`graphmem plan`: the trade-off between peak memory and extra compute for one model.

Points of the curve come from the budget model (no rewrite per point, so it is quick on big
graphs), except its bottom: the lowest plan is rewritten and estimated, since the model is
optimistic there, and model points below it or beaten by it are dropped. The `memory` and
`speed` policies are placed on the curve the same way, with their extra compute counted from
the ops they copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.cost import copied_flops
from graphmem.analysis.floor import step_floor
from graphmem.analysis.inspect import floor_facts
from graphmem.analysis.regions import analyze_regions
from graphmem.analysis.spine import analyze_spine
from graphmem.analysis.step_estimate import estimate_step
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.budget import build_units, model_base, solve_budget
from graphmem.passes.checkpoints import candidate_tensors
from graphmem.rewrite import RewriteOptions, early_updates_peak, rewrite_workspace


@dataclass
class TradeoffPoint:
    label: str
    peak_bytes: int
    extra_flops_share: float  # extra forward FLOPs / forward FLOPs of the spine
    how: str  # "model" or "estimate"
    # a rewritten plan's modelled step time at one and two inter-op threads, as multiples
    # of the original's (analysis/schedule.py StepTimes; None for the model's points)
    modelled_step_time: tuple[float, float] | None = None


@dataclass
class Tradeoff:
    original_peak_bytes: int
    forward_flops: int
    early_updates_peak_bytes: int  # no recompute, early updates only: the curve's top
    smallest_peak_bytes: int = 0  # estimated peak of the lowest plan found (the bottom)
    points: list[TradeoffPoint] = field(default_factory=list)
    policies: list[TradeoffPoint] = field(default_factory=list)
    # the peak no plan can go under (analysis/floor.py: bytes, op, parts), and why the
    # lowest plan stays above it when it is more than FLOOR_GAP over
    floor: dict = field(default_factory=dict)
    floor_note: str = ""


# The lowest plan is expected within this factor of the floor; further up, `plan` says why.
FLOOR_GAP = 1.2


def tradeoff(path, batch_size: int | None, fmt=None, tag=None, function=None,
             steps: int = 8, backward_scopes: list[str] | None = None,
             on_stage=None) -> Tradeoff:
    """The curve and the policies on it. Sizes that depend on a batch dimension nothing
    fixes are a usage error. `on_stage(text)` is told each stage as it starts."""
    from graphmem.analysis.batch import require_batch_size

    stage = on_stage or (lambda text: None)
    stage("reading the model")
    ws = Workspace.open(load_model(path, fmt, tag, function), batch_size=batch_size)
    batch_size = require_batch_size(ws, batch_size, backward_scopes=backward_scopes)
    stage("modelling the trade-off")
    index = ws.index
    regions = analyze_regions(index, backward_scopes, batch_size, ws.collection("losses"))
    if ws.refine_shapes(regions.step_nodes(index), batch_size):
        regions = analyze_regions(index, backward_scopes, batch_size, ws.collection("losses"))
    facts = analyze_forward(index, regions)
    original = estimate_step(ws, regions, batch_size).peak_bytes
    floor = step_floor(index, regions, batch_size, ws.model.graph_def.library)
    spine = analyze_spine(index, regions, facts, set(candidate_tensors(index, regions, facts)),
                          batch_size)
    units = build_units(index, spine, batch_size)
    # no recompute still has the early-updates pass, which rewrites run by default: the
    # model's base is that graph's peak (see rewrite_workspace)
    # (this edits ws, which is not used afterwards: each policy opens its own)
    no_recompute = early_updates_peak(ws, index, regions, facts,
                                      RewriteOptions("none", [], batch_size,
                                                     backward_scopes))
    base = model_base(units, no_recompute)
    total = sum(units.flops) or 1
    result = Tradeoff(original, total, no_recompute)
    low = solve_budget(units, base, 0).min_peak
    # the model is optimistic at the bottom: rewrite for its lowest peak and estimate what
    # that plan really reaches, so the curve never offers a budget no rewrite can meet
    stage("rewriting for the lowest plan")
    ws_low = Workspace.open(load_model(path, fmt, tag, function), batch_size=batch_size)
    lowest = rewrite_workspace(ws_low, RewriteOptions("budget", [], batch_size, backward_scopes,
                                                      budget=str(low), keep_worse=True))
    result.smallest_peak_bytes = min(lowest.after.peak_bytes, no_recompute)
    points = [TradeoffPoint("lowest plan", lowest.after.peak_bytes,
                            copied_flops(ws_low.index, batch_size) / total, "estimate",
                            _rounded(lowest.modelled_step_time))]
    for k in range(steps):
        budget = int(low + (original - low) * k / max(steps - 1, 1))
        sol = solve_budget(units, base, budget)
        if sol.feasible and sol.model_peak >= lowest.after.peak_bytes:  # else unreachable
            points.append(TradeoffPoint(f"budget {budget / original:.2f}", sol.model_peak,
                                        sol.extra_flops / total, "model"))
    result.points = _pareto(points)
    result.floor = floor_facts(floor)
    for policy in ("memory", "speed"):
        stage(f"rewriting with the {policy} policy")
        ws_p = Workspace.open(load_model(path, fmt, tag, function), batch_size=batch_size)
        res = rewrite_workspace(ws_p, RewriteOptions(policy, [], batch_size, backward_scopes,
                                                     keep_worse=True))
        result.policies.append(TradeoffPoint(policy, res.after.peak_bytes,
                                             copied_flops(ws_p.index, batch_size) / total,
                                             "estimate", _rounded(res.modelled_step_time)))
        # the memory policy tries plan layouts the budget model does not (no lead, late
        # copies): its peak may be the lowest found
        result.smallest_peak_bytes = min(result.smallest_peak_bytes, res.after.peak_bytes)
    if floor.bytes and result.smallest_peak_bytes > FLOOR_GAP * floor.bytes:
        result.floor_note = (
            f"the lowest plan found peaks at {result.smallest_peak_bytes / floor.bytes:.1f}x "
            "the floor: the floor is one op's footprint alone, while a plan that recomputes "
            "each forward op about once more keeps checkpoints below the op it runs (only "
            "recomputing from the input again and again, quadratic compute, would come "
            "nearer)")
    return result


def _rounded(ratio: tuple[float, float] | None) -> tuple[float, float] | None:
    return None if ratio is None else (round(ratio[0], 3), round(ratio[1], 3))


def _pareto(points: list[TradeoffPoint]) -> list[TradeoffPoint]:
    """The points no other point beats on both peak and extra compute (a model point that
    costs more than the lowest real plan for a higher peak is no option), by rising cost."""
    kept: list[TradeoffPoint] = []
    for p in sorted(points, key=lambda p: (p.extra_flops_share, p.peak_bytes)):
        if not kept or p.peak_bytes < kept[-1].peak_bytes:
            kept.append(p)
    return kept
