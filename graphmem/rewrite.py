"""The rewrite driver: analyses, then passes, then a result for the report.

Kept apart from the CLI so tests and benchmarks run the same sequence the command runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.cost import op_flops
from graphmem.analysis.memory import MemoryEstimate
from graphmem.analysis.regions import analyze_regions
from graphmem.background import Background
from graphmem.estimate import estimate_step
from graphmem.formats import LoadedModel, load_model, save_model, save_unchanged
from graphmem.graph import dtypes
from graphmem.graph.index import nbytes
from graphmem.graph.workspace import Workspace
from graphmem.passes.checkpoints import (
    CheckpointChoice,
    candidate_tensors,
    choose_checkpoints,
    keep_top_segment,
)
from graphmem.passes.early_updates import EarlyUpdatesPlan, apply_early_updates
from graphmem.passes.late_terms import apply_late_terms
from graphmem.passes.loop_recompute import LoopRecomputePlan, apply_loop_recompute
from graphmem.passes.loop_sums import hold_loop_sums
from graphmem.passes.recompute import COPY_SCOPE, RecomputePlan, apply_recompute
from graphmem.passes.split_identityn import split_gradient_identityn

if TYPE_CHECKING:  # imported where used: most rewrites need none of them (start-up time)
    from graphmem.passes.budget import BudgetSolution
    from graphmem.passes.loop_recompute_v1 import LoopRecomputeV1Plan
    from graphmem.passes.swap import SwapOptions, SwapPlan

# A budget plan the estimate finds this far (a share of the budget) below what the model
# said is worth planning again with the model's error taken into account: a cheaper plan
# may fit.
MODEL_SLACK = 0.02
# Plans tried between a budget plan that fits and one that does not (each one more apply
# and estimate), and the model solves that may take to find them
BISECT_STEPS = 3
BISECT_PROBES = 8
# The memory policy writes the plan with the lowest estimated peak of those it tries; a plan
# within this share of that peak is as good (the estimate's own error is larger), and the one
# of them with the least recompute is written: never a plan another one beats on both.
MEMORY_TOLERANCE = 0.03
# Budget-model plans the memory policy tries above the model's lowest peak (as shares of
# it): cheaper plans that may peak about as low once applied and estimated.
MEMORY_PROBES = (1.1, 1.25)
# Graphs with more nodes than this get the heuristic plan alone (one apply and estimate
# instead of about six): on them the tool's own time is what a user waits for.
MEMORY_SEARCH_NODES = 60_000


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
    recompute_loops: bool = False  # v2 loops whose functions only read state may be replayed
    # rebuild values inside v2 loop bodies instead of accumulating them (None: with every
    # recompute policy, off with policy "none")
    loop_recompute: bool | None = None

    def loop_body_policy(self) -> str | None:
        """The policy inside loop bodies (speed keeps matmul outputs), None when off."""
        on = self.policy != "none" if self.loop_recompute is None else self.loop_recompute
        if not on:
            return None
        return "speed" if self.policy == "speed" else "memory"


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
    loops: LoopRecomputePlan | None = None
    loops_v1: LoopRecomputeV1Plan | None = None  # recompute inside v1 loops (None: off)


def rewrite_workspace(ws: Workspace, options: RewriteOptions) -> RewriteResult:
    index = ws.index
    regions = analyze_regions(index, options.backward_scopes, options.batch_size,
                              ws.collection("losses"))
    if ws.refine_shapes(regions.step_nodes(index), options.batch_size):
        regions = analyze_regions(index, options.backward_scopes, options.batch_size,
                                  ws.collection("losses"))
    replayable = set()
    if options.recompute_loops:
        from graphmem.analysis.replayable_loops import replayable_loops

        replayable = replayable_loops(index, {f.signature.name: f for f in
                                              ws.model.graph_def.library.function})
    facts = analyze_forward(index, regions, replayable)
    # The estimate of the original graph waits for nothing the passes do: a forked child
    # computes it while they run (the budget policy needs it first; Grappler imports TF)
    aside = options.policy != "budget" and not options.grappler
    before_job = Background(lambda: _estimate(ws, regions, options), len(index),
                            force=None if aside else False)
    try:  # a failure before the original's estimate is collected stops its child
        nodes_before = len(index)
        original = ws.graph_def.SerializeToString()  # to undo a rewrite; bytes are compact

        def restore(reindex: bool = True):
            ws.graph_def.ParseFromString(original)
            _restore_functions(ws)
            if reindex:
                return ws.reindex(appended=False)
            # the original's index still describes the graph (passes edit the graph and
            # index anew; the driver keeps using `index` after every restore)
            ws.index = index
            return index
        budget = solution = base_peak = None
        if options.policy == "budget":
            from graphmem.passes.budget import parse_budget

            base_peak = before_job.result().peak_bytes
            budget = parse_budget(options.budget or "", base_peak)
        if budget is not None and options.early_updates and options.swap is None:
            # the budget model's base is the peak without recompute *after* early updates: on
            # graphs whose peak is weight gradients waiting for the optimizer (MLPs) they alone
            # remove most of it, and a base from the original would buy recompute for nothing
            base_peak = early_updates_peak(ws, index, regions, facts, options)
            restore()
        if budget is None and options.policy == "memory" and _searches_memory(options,
                                                                                len(index)):
            best = _memory_plan(ws, index, regions, facts, options, restore)
            choice, checkpoints, after = best.choice, best.checkpoints, best.after
            plan, swap_plan, early, new_index, new_regions, loops, loops_v1 = best.passes
        elif budget is None:
            choice = choose_checkpoints(options.policy, index, regions, facts, options.batch_size,
                                        options.checkpoint_patterns, ws.collection("checkpoints"))
            checkpoints = _checkpoint_facts(index, choice.tensors, options.batch_size)
            plan, swap_plan, early, new_index, new_regions, loops, loops_v1 = _apply_passes(
                ws, index, regions, facts, choice, checkpoints, options)
            after = _estimate(ws, new_regions, options)
        else:
            best, solution = _budget_plan(ws, index, regions, facts, options, budget, base_peak,
                                          restore)
            choice, checkpoints, after = best.choice, best.checkpoints, best.after
            plan, swap_plan, early, new_index, new_regions, loops, loops_v1 = best.passes
    except BaseException:
        before_job.cancel()
        raise
    before = before_job.result() or _estimate_bytes(ws, original, options)
    reverted = after.peak_bytes > before.peak_bytes and not options.keep_worse
    if reverted:  # never hand back a graph the estimate says is worse
        new_index = restore(reindex=False)
    ws.function_backup.clear()
    ws.commit()
    return RewriteResult(ws.model, choice, checkpoints, plan, swap_plan, before, after,
                         nodes_before, len(new_index), reverted, early, budget, solution,
                         loops, loops_v1)


def _budget_plan(ws: Workspace, index, regions, facts, options: RewriteOptions, budget: int,
                 base_peak: int, restore) -> tuple[_Run, BudgetSolution | None]:
    """The plan with the least recompute whose *estimated* peak fits the budget, or the
    lowest one. The budget model (passes/budget.py) is a chain and errs both ways: each
    of its plans is applied and estimated, and the error learned corrects the next
    attempt's budget (up when the model was pessimistic, down when optimistic). Plans of
    the memory and speed policies are candidates too, and the memory policy's with its
    top segment kept (`keep_top_segment`); when no plan fits, so is the model's lowest.
    Last, the model's budget is bisected between the plans that fit and those that do
    not. Leaves the chosen plan applied."""
    from graphmem.passes.budget import choose_budget_checkpoints

    runs: list[_Run] = []
    tried: dict[tuple[bool, ...], bool] = {}  # plan (units recomputed) -> fits the budget
    probes: list[tuple[int, bool]] = []  # (budget the model planned for, its plan fits)

    def attempt(model_budget: int) -> BudgetSolution | None:
        """Plan for `model_budget` with the model, apply and estimate the plan (once per
        distinct plan); returns the model's solution."""
        choice, sol = choose_budget_checkpoints(
            index, regions, facts, candidate_tensors(index, regions, facts),
            options.batch_size, model_budget, base_peak)
        key = tuple(sol.recompute) if sol is not None else None
        if key in tried:
            probes.append((model_budget, tried[key]))
            return sol  # a plan already estimated
        checkpoints = _checkpoint_facts(index, choice.tensors, options.batch_size)
        passes = _apply_passes(ws, index, regions, facts, choice, checkpoints, options)
        after = _estimate(ws, passes[4], options)
        runs.append(_Run("budget", choice, checkpoints, passes, after,
                         copied_flops(passes[3], options.batch_size), sol))
        restore()
        if key is not None:
            tried[key] = after.peak_bytes <= budget
            probes.append((model_budget, tried[key]))
        return sol

    correction = 0
    for _attempt in range(4):
        known = len(runs)
        solution = attempt(budget - correction)
        if solution is None or len(runs) == known:
            break  # no spine to plan on, or corrected to a plan already estimated
        after = runs[-1].after
        error = after.peak_bytes - solution.model_peak
        fits = after.peak_bytes <= budget
        if fits and error >= -MODEL_SLACK * budget:
            break  # the model was right here: a cheaper plan would not fit
        if not fits and not solution.feasible:
            break  # the model's lowest plan is over already
        correction = error
    if solution is not None and not any(fits for _, fits in probes):
        # the corrections can stop short of the model's lowest plan, which is what
        # `graphmem plan` offers as the bottom of its curve (planned for a budget of its
        # peak: below it the model returns another plan of that peak): a candidate too
        attempt(solution.min_peak)
    new_plans = len(runs) + BISECT_STEPS
    for _probe in range(BISECT_PROBES):
        # one correction can overshoot: the model's error differs from plan to plan. Between
        # the largest model budget whose plan fits and the smallest above it whose plan
        # does not, a cheaper plan that fits may lie (a probe may land on a plan already
        # estimated: it narrows the interval all the same)
        fit = [b for b, fits in probes if fits]
        over = [b for b, fits in probes if not fits and fit and b > max(fit)]
        if not over or min(over) - max(fit) <= MODEL_SLACK * budget or \
                len(runs) >= new_plans:
            break
        attempt((max(fit) + min(over)) // 2)
    # the memory policy's candidates (its heuristic's plans, and the model's lowest ones)
    # and the speed policy's
    runs.extend(_memory_runs(ws, index, regions, facts, options, restore, base_peak))
    speed = choose_checkpoints("speed", index, regions, facts, options.batch_size)
    speed_facts = _checkpoint_facts(index, speed.tensors, options.batch_size)
    passes = _apply_passes(ws, index, regions, facts, speed, speed_facts, options)
    runs.append(_Run("speed", speed, speed_facts, passes, _estimate(ws, passes[4], options),
                     copied_flops(passes[3], options.batch_size)))
    restore()
    fitting = [r for r in runs if r.after.peak_bytes <= budget]
    best = min(fitting, key=lambda r: r.extra_flops) if fitting else \
        min(runs, key=lambda r: r.after.peak_bytes)
    best.passes = _apply_passes(ws, index, regions, facts, best.choice, best.checkpoints,
                                options)
    model_runs = [r for r in runs if r.solution is not None]
    solution = best.solution or (model_runs[-1].solution if model_runs else None)
    if solution is not None:
        model_run = next((r for r in model_runs if r.after.peak_bytes <= budget),
                         model_runs[-1] if model_runs else best)
        best.choice.policy = "budget"
        best.choice.note = _budget_note(solution, budget, best.after.peak_bytes, best.policy,
                                        model_run, best)
        solution.chosen, solution.extra_flops = best.policy, best.extra_flops
    return best, solution


def _searches_memory(options: RewriteOptions, nodes: int) -> bool:
    """The memory policy tries several plans (`_memory_plan`) unless checkpoints are named,
    tensors are swapped (the swap pass acts on the heuristic's checkpoints), or the graph
    is big enough that the search would dominate the tool's time."""
    return (options.policy in ("memory", "budget") and not options.checkpoint_patterns
            and options.swap is None and nodes <= MEMORY_SEARCH_NODES)


def _memory_plan(ws: Workspace, index, regions, facts, options: RewriteOptions,
                 restore) -> _Run:
    """The memory policy: the plan with the lowest estimated peak among `_memory_runs`;
    among the plans within MEMORY_TOLERANCE of it, the one with the least recompute (so no
    plan tried beats it on both). Leaves it applied."""
    from graphmem.units import format_bytes

    base_peak = early_updates_peak(ws, index, regions, facts, options) \
        if options.early_updates else None
    restore()
    runs = _memory_runs(ws, index, regions, facts, options, restore, base_peak)
    lowest = min(r.after.peak_bytes for r in runs)
    best = min((r for r in runs if r.after.peak_bytes <= lowest * (1 + MEMORY_TOLERANCE)),
               key=lambda r: (r.extra_flops, r.after.peak_bytes))
    best.passes = _apply_passes(ws, index, regions, facts, best.choice, best.checkpoints,
                                options)
    how = {"memory": "the bottleneck heuristic's plan",
           "memory_top": "the bottleneck heuristic's plan with its top segment kept",
           "budget": "the budget model's plan"}[best.policy]
    note = (f"{how}: the lowest estimated peak ({format_bytes(best.after.peak_bytes)}) "
            f"of {len(runs)} plans tried, with the least recompute within "
            f"{MEMORY_TOLERANCE:.0%} of it")
    best.choice = replace(best.choice, policy="memory", note=note)
    return best


def _memory_runs(ws: Workspace, index, regions, facts, options: RewriteOptions, restore,
                 base_peak: int | None) -> list[_Run]:
    """The memory policy's candidate plans, each applied, estimated and undone: the
    bottleneck heuristic's (about sqrt(N) bottlenecks spaced by bytes, and the same with its
    top segment kept) and the budget model's lowest plans (every unit recomputed with the
    best cuts kept, and the cheapest plans modelled MEMORY_PROBES above that), with and
    without the units' weight-gradient transients in the model. All are estimated: the
    heuristic spaces cuts by bytes alone and keeps adjacent tensors; the model is a chain
    and errs both ways. `base_peak`: the budget model's base (the peak
    with early updates alone), None for the heuristic's estimate."""
    from graphmem.passes.budget import choose_budget_checkpoints

    runs: list[_Run] = []
    candidates = candidate_tensors(index, regions, facts)

    def run(policy: str, choice: CheckpointChoice, solution=None) -> None:
        facts_of = _checkpoint_facts(index, choice.tensors, options.batch_size)
        passes = _apply_passes(ws, index, regions, facts, choice, facts_of, options)
        runs.append(_Run(policy, choice, facts_of, passes, _estimate(ws, passes[4], options),
                         copied_flops(passes[3], options.batch_size), solution))
        restore()

    heuristic = choose_checkpoints("memory", index, regions, facts, options.batch_size)
    run("memory", heuristic)
    top = replace(heuristic, tensors=keep_top_segment(index, regions, heuristic.tensors,
                                                      candidates))
    if top.tensors != heuristic.tensors:
        run("memory_top", top)
    if not _searches_memory(options, len(index)):
        return runs
    if base_peak is None:
        base_peak = runs[0].after.peak_bytes
    seen: set[tuple[bool, ...]] = set()
    for transients in (True, False):  # with each unit's weight-gradient transient or not
        choice, solution = choose_budget_checkpoints(index, regions, facts, candidates,
                                                     options.batch_size, 0, base_peak,
                                                     transients=transients)
        if solution is None:
            return runs
        floor = solution.min_peak
        for share in (1.0, *MEMORY_PROBES):
            choice, solution = choose_budget_checkpoints(
                index, regions, facts, candidates, options.batch_size, int(floor * share),
                base_peak, transients=transients)
            key = tuple(solution.recompute) + tuple(solution.keep_cut)
            if key not in seen and choice.tensors:
                seen.add(key)
                run("budget", choice, solution)
    return runs


def _restore_functions(ws: Workspace) -> None:
    """Undo the loop pass's edits of library functions (a TF2 train step's workspace
    graph is one function: restoring it leaves the loop bodies as edited)."""
    if not ws.function_backup:
        return
    for f in ws.model.graph_def.library.function:
        data = ws.function_backup.get(f.signature.name)
        if data is not None:
            f.ParseFromString(data)
    ws.function_backup.clear()


def _estimate(ws: Workspace, regions, options: RewriteOptions) -> MemoryEstimate:
    return estimate_step(ws, regions, options.batch_size, options.backward_scopes,
                         options.grappler, keep_timeline=options.keep_timeline,
                         host_device=options.swap.host if options.swap else None)


def _estimate_bytes(ws: Workspace, graph: bytes, options: RewriteOptions) -> MemoryEstimate:
    """Estimate the graph serialized in `graph` without touching the workspace (when the
    child estimating the original failed)."""
    graph_def = type(ws.graph_def)()
    graph_def.ParseFromString(graph)
    other = replace(ws, graph_def=graph_def, view=None)
    index = other.reindex(appended=False)
    regions = analyze_regions(index, options.backward_scopes, options.batch_size,
                              ws.collection("losses"))
    return _estimate(other, regions, options)


def early_updates_peak(ws: Workspace, index, regions, facts, options: RewriteOptions) -> int:
    """Estimated peak of the graph with the early-updates pass alone (no recompute). Edits
    the workspace: the caller restores it."""
    none = CheckpointChoice("none", [])
    new_regions = _apply_passes(ws, index, regions, facts, none, [], options)[4]
    return estimate_step(ws, new_regions, options.batch_size, options.backward_scopes,
                         options.grappler).peak_bytes


@dataclass
class _Run:
    """One candidate plan of the budget policy, applied and estimated."""

    policy: str
    choice: CheckpointChoice
    checkpoints: list[CheckpointFact]
    passes: tuple
    after: MemoryEstimate
    extra_flops: int  # FLOPs of the ops it copies
    solution: BudgetSolution | None = None  # the budget model's, for its own plans


def copied_flops(index, batch_size: int | None) -> int:
    """Extra forward FLOPs of a rewritten graph: those of its recompute copies."""
    return sum(op_flops(index, i, batch_size) for i in range(len(index))
               if index.names[i].startswith(COPY_SCOPE + "/"))


def _budget_note(solution: BudgetSolution, budget: int, estimated: int, policy: str,
                 model_run: _Run, best: _Run) -> str:
    from graphmem.units import format_bytes

    total = solution.total_flops or 1
    solution.feasible = estimated <= budget  # the estimate decides, not the model
    plan = {"memory_top": "the memory policy's plan with its top segment kept"}.get(
        policy, f"the {policy} policy's plan")
    if estimated > budget:
        return (f"the budget of {format_bytes(budget)} cannot be met: the lowest plan found "
                f"({solution.method if policy == 'budget' else plan}) "
                f"reaches {format_bytes(estimated)}, {format_bytes(estimated - budget)} over")
    if policy != "budget":
        model = ("did not fit" if model_run.after.peak_bytes > budget else
                 f"+{model_run.extra_flops / total:.0%} forward FLOPs")
        return (f"{plan} (+{best.extra_flops / total:.0%} forward FLOPs) "
                f"fits the budget of {format_bytes(budget)} with the least recompute (the "
                f"budget model's plan: {model})")
    return (f"{solution.method}: {sum(solution.recompute)} of {len(solution.recompute)} "
            f"units recomputed (+{best.extra_flops / total:.0%} forward FLOPs) for a budget of "
            f"{format_bytes(budget)}")


def _apply_passes(ws: Workspace, index, regions, facts, choice, checkpoints, options):
    """Recompute, then recompute inside loops (v2 bodies, v1 frames), then swap, then
    late terms and early updates, re-indexing after each pass that edits."""
    plan = RecomputePlan()
    if choice.policy != "none":
        plan = apply_recompute(index, regions, facts, choice.tensors, options.batch_size)
    new_index = ws.reindex()
    loops = None
    body_policy = options.loop_body_policy()
    if body_policy is not None:
        loops = apply_loop_recompute(new_index, ws.model.graph_def.library, body_policy,
                                     options.batch_size, ws.model.function_name,
                                     ws.function_backup)
        if loops.changed:
            new_index = ws.reindex()
    new_regions = analyze_regions(new_index, options.backward_scopes, options.batch_size,
                                  ws.collection("losses"))
    loops_v1 = None
    if body_policy is not None and any(new_index.frame):
        loops_v1 = _loops_v1(new_index, body_policy, options)
        if loops_v1.loops:
            new_index = ws.reindex()
            new_regions = analyze_regions(new_index, options.backward_scopes,
                                          options.batch_size, ws.collection("losses"))
    swap_plan = None
    if options.swap is not None:
        kept = [c.name for c in checkpoints] if choice.policy != "none" else None
        swap_plan, new_index, new_regions = _swap(ws, new_index, new_regions, kept, options)
    early = None
    if options.early_updates:
        # a Keras optimizer's IdentityN over all gradients would hold every update back
        # until the last gradient exists: split it first
        split = split_gradient_identityn(new_index, new_regions)
        # and in v1 gradient loops, each iteration's weight-gradient term waits for the
        # running sum, so iterations do not run ahead holding their terms
        sums = hold_loop_sums(new_index)
        if split.split or sums:
            new_index = ws.reindex()
            new_regions = analyze_regions(new_index, options.backward_scopes,
                                          options.batch_size, ws.collection("losses"))
        kept = [new_index.id_of[c.name.rsplit(":", 1)[0]] for c in checkpoints
                if c.name.rsplit(":", 1)[0] in new_index.id_of]
        # weight-decay terms wait for the gradient they join, then each update runs as
        # soon as that sum exists. Both only add control edges: the index takes them in
        # place, and the regions stay as they were (step_nodes, all the estimate reads)
        late = apply_late_terms(new_index, new_regions, options.batch_size)
        early = apply_early_updates(new_index, new_regions, kept, options.backward_scopes)
        early.split_identityn = split.split
        early.late_terms, early.late_term_bytes = late.terms, late.bytes
        early.loop_sums_held = sums
    return plan, swap_plan, early, new_index, new_regions, loops, loops_v1


def _loops_v1(index, policy: str, options: RewriteOptions) -> LoopRecomputeV1Plan:
    """Recompute inside v1 loop frames: the speed policy also keeps matmul outputs."""
    from graphmem.analysis.loops import analyze_loops
    from graphmem.passes.loop_recompute_v1 import apply_loop_recompute_v1

    trips = {"/" + lp.name: lp.trip_count for lp in
             analyze_loops(index, options.batch_size).loops if lp.kind == "v1"}
    return apply_loop_recompute_v1(index, options.batch_size, keep_matmuls=policy == "speed",
                                   trip_counts=trips)


def _swap(ws: Workspace, index, regions, kept: list[str] | None, options: RewriteOptions):
    """Swap saved activations, or with a recompute policy, the checkpoints it kept."""
    from graphmem.passes.swap import SwapPlan, apply_swap, choose_swap_tensors

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
                 fmt=None, tag=None, function=None, on_stage=None) -> RewriteResult:
    """Read, rewrite, write. Sizes that depend on a batch dimension nothing fixes are a
    usage error (a plan and a peak from unknown sizes would be wrong). `on_stage(text)` is
    told each stage as it starts (a progress display)."""
    from graphmem.analysis.batch import require_batch_size

    stage = on_stage or (lambda text: None)
    stage("reading the model")
    ws = Workspace.open(load_model(model_path, fmt, tag, function),
                        batch_size=options.batch_size)
    batch = require_batch_size(ws, options.batch_size, backward_scopes=options.backward_scopes)
    if batch != options.batch_size:
        options = replace(options, batch_size=batch)
    stage("rewriting")
    result = rewrite_workspace(ws, options)
    stage("writing the output")
    if result.reverted:  # undone: the output is the input itself
        save_unchanged(ws.model, out)
    else:
        save_model(ws.model, out)
    return result
