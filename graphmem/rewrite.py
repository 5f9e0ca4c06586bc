"""The rewrite driver: analyses, then passes, then a result for the report.

Kept apart from the CLI so tests and benchmarks run the same sequence the command runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.memory import MemoryEstimate
from graphmem.analysis.regions import analyze_regions
from graphmem.estimate import estimate_step
from graphmem.formats import LoadedModel, load_model, save_model
from graphmem.graph import dtypes
from graphmem.graph.index import nbytes
from graphmem.graph.workspace import Workspace
from graphmem.passes.budget import BudgetSolution, choose_budget_checkpoints, parse_budget
from graphmem.passes.checkpoints import CheckpointChoice, candidate_tensors, choose_checkpoints
from graphmem.passes.early_updates import EarlyUpdatesPlan, apply_early_updates
from graphmem.passes.recompute import RecomputePlan, apply_recompute
from graphmem.passes.split_identityn import split_gradient_identityn
from graphmem.passes.swap import SwapOptions, SwapPlan, apply_swap, choose_swap_tensors


@dataclass
class CheckpointFact:
    name: str
    shape: list[int] | None
    dtype: str
    bytes: int | None


@dataclass
class RewriteOptions:
    policy: str = "memory"
    checkpoint_patterns: list[str] = field(default_factory=list)
    batch_size: int | None = None
    backward_scopes: list[str] | None = None
    grappler: bool = False  # estimate on the graph as Grappler will run it
    keep_timeline: bool = False  # for plots
    swap: SwapOptions | None = None  # swap pass on, with these options
    keep_worse: bool = False  # keep a rewrite even when its estimated peak is higher
    early_updates: bool = True  # run optimizer updates as soon as their gradient is ready
    budget: str | None = None  # with policy "budget": a size or a fraction of the peak


@dataclass
class RewriteResult:
    model: LoadedModel
    choice: CheckpointChoice
    checkpoints: list[CheckpointFact]
    plan: RecomputePlan
    swap: SwapPlan | None
    before: MemoryEstimate
    after: MemoryEstimate
    nodes_before: int
    nodes_after: int
    reverted: bool = False  # the rewrite raised the estimated peak and was undone
    early: EarlyUpdatesPlan | None = None
    budget_bytes: int | None = None
    budget: BudgetSolution | None = None


def rewrite_workspace(ws: Workspace, options: RewriteOptions) -> RewriteResult:
    index = ws.index
    regions = analyze_regions(index, options.backward_scopes, options.batch_size,
                              ws.collection("losses"))
    if ws.refine_shapes(regions.step_nodes(index), options.batch_size):
        regions = analyze_regions(index, options.backward_scopes, options.batch_size,
                                  ws.collection("losses"))
    facts = analyze_forward(index, regions)
    host = options.swap.host if options.swap else None
    before = estimate_step(ws, regions, options.batch_size, options.backward_scopes,
                           options.grappler, keep_timeline=options.keep_timeline,
                           host_device=host)
    nodes_before = len(index)
    original = ws.graph_def.SerializeToString()  # to undo a rewrite; bytes are compact
    budget = solution = None
    if options.policy == "budget":
        budget = parse_budget(options.budget or "", before.peak_bytes)
    base_peak = before.peak_bytes
    if budget is not None and options.early_updates and options.swap is None:
        # the budget model's base is the peak without recompute *after* early updates: on
        # graphs whose peak is weight gradients waiting for the optimizer (MLPs) they alone
        # remove most of it, and a base from the original would buy recompute for nothing
        base_peak = early_updates_peak(ws, index, regions, facts, options)
        ws.graph_def.ParseFromString(original)
        ws.reindex(appended=False)
    correction = 0  # what the estimate found above the budget model, learned per attempt
    for attempt in range(4):
        if budget is not None:
            choice, solution = choose_budget_checkpoints(
                index, regions, facts, candidate_tensors(index, regions, facts),
                options.batch_size, budget - correction, base_peak)
        else:
            choice = choose_checkpoints(options.policy, index, regions, facts,
                                        options.batch_size, options.checkpoint_patterns,
                                        ws.collection("checkpoints"))
        checkpoints = _checkpoint_facts(index, choice.tensors, options.batch_size)
        plan, swap_plan, early, new_index, new_regions = _apply_passes(
            ws, index, regions, facts, choice, checkpoints, options)
        after = estimate_step(ws, new_regions, options.batch_size, options.backward_scopes,
                              options.grappler, keep_timeline=options.keep_timeline,
                              host_device=host)
        if budget is None or solution is None or after.peak_bytes <= budget \
                or not solution.feasible or attempt == 3:
            break
        # the model was optimistic for this graph: learn by how much, and plan again
        correction += after.peak_bytes - solution.model_peak - correction
        ws.graph_def.ParseFromString(original)
        ws.reindex(appended=False)
    if solution is not None and after.peak_bytes > budget:
        # the chain model could not place the plan under the budget: the sqrt(N) memory
        # policy sometimes lands lower; take whichever the estimate says is lower
        ws.graph_def.ParseFromString(original)
        ws.reindex(appended=False)
        alt = choose_checkpoints("memory", index, regions, facts, options.batch_size)
        alt_facts = _checkpoint_facts(index, alt.tensors, options.batch_size)
        alt_run = _apply_passes(ws, index, regions, facts, alt, alt_facts, options)
        alt_after = estimate_step(ws, alt_run[4], options.batch_size, options.backward_scopes,
                                  options.grappler, keep_timeline=options.keep_timeline,
                                  host_device=host)
        if alt_after.peak_bytes < after.peak_bytes:
            choice, checkpoints, after = alt, alt_facts, alt_after
            plan, swap_plan, early, new_index, new_regions = alt_run
            choice.policy = "budget"
            choice.note = "the memory policy's plan (lower than the budget model's)"
        else:  # redo the budget plan
            ws.graph_def.ParseFromString(original)
            ws.reindex(appended=False)
            plan, swap_plan, early, new_index, new_regions = _apply_passes(
                ws, index, regions, facts, choice, checkpoints, options)
    if solution is not None:
        choice.note = _budget_note(solution, budget, after.peak_bytes, choice.note)
    reverted = after.peak_bytes > before.peak_bytes and not options.keep_worse
    if reverted:  # never hand back a graph the estimate says is worse
        ws.graph_def.ParseFromString(original)
        new_index = ws.reindex(appended=False)
    ws.commit()
    return RewriteResult(ws.model, choice, checkpoints, plan, swap_plan, before, after,
                         nodes_before, len(new_index), reverted, early, budget, solution)


def early_updates_peak(ws: Workspace, index, regions, facts, options: RewriteOptions) -> int:
    """Estimated peak of the graph with the early-updates pass alone (no recompute). Edits
    the workspace: the caller restores it."""
    none = CheckpointChoice("none", [])
    *_, new_regions = _apply_passes(ws, index, regions, facts, none, [], options)
    return estimate_step(ws, new_regions, options.batch_size, options.backward_scopes,
                         options.grappler).peak_bytes


def _budget_note(solution: BudgetSolution, budget: int, estimated: int, how: str) -> str:
    from graphmem.units import format_bytes

    share = solution.extra_flops / solution.total_flops if solution.total_flops else 0.0
    if estimated <= budget and "memory" in how:
        return (f"the memory policy's plan fits the budget of {format_bytes(budget)} (the "
                "budget model's plan did not)")
    if estimated <= budget:
        return (f"{solution.method}: {sum(solution.recompute)} of {len(solution.recompute)} "
                f"units recomputed (+{share:.0%} forward FLOPs) for a budget of "
                f"{format_bytes(budget)}")
    solution.feasible = False
    return (f"the budget of {format_bytes(budget)} cannot be met: the lowest plan found "
            f"({'the memory policy' if 'memory' in how else solution.method}) reaches "
            f"{format_bytes(estimated)}, {format_bytes(estimated - budget)} over")


def _apply_passes(ws: Workspace, index, regions, facts, choice, checkpoints, options):
    """Recompute, then swap, then early updates, re-indexing after each pass that edits."""
    plan = RecomputePlan()
    if choice.policy != "none":
        plan = apply_recompute(index, regions, facts, choice.tensors)
    new_index = ws.reindex()
    new_regions = analyze_regions(new_index, options.backward_scopes, options.batch_size,
                                  ws.collection("losses"))
    swap_plan = None
    if options.swap is not None:
        kept = [c.name for c in checkpoints] if choice.policy != "none" else None
        swap_plan, new_index, new_regions = _swap(ws, new_index, new_regions, kept, options)
    early = None
    if options.early_updates:
        # a Keras optimizer's IdentityN over all gradients would hold every update back
        # until the last gradient exists: split it first
        split = split_gradient_identityn(new_index, new_regions)
        if split.split:
            new_index = ws.reindex()
            new_regions = analyze_regions(new_index, options.backward_scopes,
                                          options.batch_size, ws.collection("losses"))
        kept = [new_index.id_of[c.name.rsplit(":", 1)[0]] for c in checkpoints
                if c.name.rsplit(":", 1)[0] in new_index.id_of]
        # edges from updates to backward ops: the index takes them in place, and the
        # regions stay as they were (step_nodes, all the estimate reads, is unchanged)
        early = apply_early_updates(new_index, new_regions, kept, options.backward_scopes)
        early.split_identityn = split.split
    return plan, swap_plan, early, new_index, new_regions


def _swap(ws: Workspace, index, regions, kept: list[str] | None, options: RewriteOptions):
    """Swap saved activations, or with a recompute policy, the checkpoints it kept."""
    swap_options = options.swap
    if kept is not None:
        found = [index.tensor(name) for name in kept]
        swap_options = replace(swap_options, tensors=[t for t in found if t is not None])
    plan = SwapPlan()
    tensors = choose_swap_tensors(index, regions, swap_options, options.batch_size, plan)
    apply_swap(index, regions, tensors, swap_options, options.batch_size, plan)
    new_index = ws.reindex()
    new_regions = analyze_regions(new_index, options.backward_scopes, options.batch_size,
                                  ws.collection("losses"))
    return plan, new_index, new_regions


def _checkpoint_facts(index, tensors, batch_size) -> list[CheckpointFact]:
    return [CheckpointFact(index.tensor_name(t), index.shape(t),
                           dtypes.name(index.dtype(t) or 0),
                           nbytes(index.shape(t), index.dtype(t), batch_size))
            for t in tensors]


def rewrite_file(model_path: str | Path, out: str | Path, options: RewriteOptions,
                 fmt=None, tag=None, function=None) -> RewriteResult:
    ws = Workspace.open(load_model(model_path, fmt, tag, function),
                        batch_size=options.batch_size)
    result = rewrite_workspace(ws, options)
    save_model(ws.model, out)
    return result
