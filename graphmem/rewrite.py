"""The rewrite driver: analyses, then passes, then a result for the report.

Kept apart from the CLI so tests and benchmarks run the same sequence the command runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.cost import copied_flops
from graphmem.analysis.memory import MemoryEstimate
from graphmem.analysis.regions import analyze_regions
from graphmem.analysis.step_estimate import estimate_step
from graphmem.analysis.towers import gated_peak
from graphmem.background import Background
from graphmem.formats import LoadedModel, load_model, save_model, save_unchanged
from graphmem.graph import dtypes
from graphmem.graph.workspace import Workspace
from graphmem.passes.base import PassContext, PassPlan
from graphmem.passes.checkpoints import CheckpointChoice, choose_checkpoints
from graphmem.passes.early_updates import EarlyUpdatesPlan
from graphmem.passes.loop_recompute import LoopRecomputePlan
from graphmem.passes.pipeline import PipelineResult, run_pipeline
from graphmem.passes.recompute import RecomputePlan

if TYPE_CHECKING:  # imported where used: most rewrites need none of them (start-up time)
    from graphmem.analysis.schedule import StepTimes
    from graphmem.passes.budget import BudgetSolution
    from graphmem.passes.loop_recompute_v1 import LoopRecomputeV1Plan
    from graphmem.passes.swap import SwapOptions, SwapPlan

__all__ = ["CheckpointFact", "RewriteOptions", "RewriteResult", "copied_flops",
           "early_updates_peak", "rewrite_file", "rewrite_workspace"]


@dataclass
class CheckpointFact:
    name: str
    shape: list[int] | None
    dtype: str
    bytes: int | None


# the least share of the original's estimated peak a rewrite must save to be kept: below
# it the saving is within the estimate's error, and the step TF runs may peak higher (the
# sweep's Keras MLP with gradient clipping, whose peak is the optimizer's: rewrites
# estimated 3% and 0.2% lower measured 2% and 1% higher, medians of 4 processes)
MIN_SAVING = 0.05


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
    passes: dict[str, PassPlan] = field(default_factory=dict)  # pass name -> plan, as run
    seconds: dict[str, float] = field(default_factory=dict)  # pipeline stage -> wall seconds

    @property
    def modelled_step_time(self) -> tuple[float, float] | None:
        """The rewrite's modelled step time at one and two inter-op threads, as multiples
        of the original's (analysis/schedule.py); None where a step was not walked on two
        threads (v1 loops, very large steps)."""
        before, after = self.before.step_times, self.after.step_times
        return None if before is None or after is None else after.ratio(before)


def rewrite_workspace(ws: Workspace, options: RewriteOptions) -> RewriteResult:
    index = ws.index
    regions = _regions(ws, index, options)
    if ws.refine_shapes(regions.step_nodes(index), options.batch_size):
        regions = _regions(ws, index, options)
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
            from graphmem.passes.budget import search_memory

            base_peak = None
            if options.early_updates:
                base_peak = early_updates_peak(ws, index, regions, facts, options)
                restore()
            best = search_memory(index, regions, facts, options.batch_size, base_peak,
                                 _Runner(ws, index, regions, facts, options, restore),
                                 lambda: _step_times(before_job))
            choice, after = best.choice, best.after
            checkpoints, done = best.applied
        elif budget is None:
            choice = choose_checkpoints(options.policy, index, regions, facts, options.batch_size,
                                        options.checkpoint_patterns, ws.collection("checkpoints"))
            checkpoints = _checkpoint_facts(index, choice.tensors, options.batch_size)
            done = _run_passes(ws, index, regions, facts, choice, checkpoints, options)
            after = _estimate(ws, done.regions, options)
        else:
            from graphmem.passes.budget import search_budget

            best, solution = search_budget(index, regions, facts, options.batch_size, budget,
                                           base_peak, _Runner(ws, index, regions, facts,
                                                              options, restore),
                                           _searches_memory(options, len(index)))
            choice, after = best.choice, best.after
            checkpoints, done = best.applied
    except BaseException:
        before_job.cancel()
        raise
    before = before_job.result() or _estimate_bytes(ws, original, options)
    # kept only when its highest peak over the executor's orders (the one a training run
    # reaches) is at least MIN_SAVING below the original's: an edited graph that saves
    # less is undone too; across data-parallel towers, no tower may peak higher either
    edited = any(getattr(plan, "changed", False) for plan in done.plans.values())
    reverted = not options.keep_worse and (
        after.peak_bytes > before.peak_bytes
        or (edited and after.peak_bytes > (1 - MIN_SAVING) * before.peak_bytes)
        or gated_peak(after.peak_bytes, after.peak_by_device)[0]
        > gated_peak(before.peak_bytes, before.peak_by_device)[0])
    new_index = done.index
    if reverted:  # never hand back a graph the estimate says is worse
        new_index = restore(reindex=False)
    ws.function_backup.clear()
    ws.commit()
    plans = done.plans
    return RewriteResult(
        model=ws.model, choice=choice, checkpoints=checkpoints,
        plan=plans.get("recompute") or RecomputePlan(), swap=plans.get("swap"),
        before=before, after=after, nodes_before=nodes_before, nodes_after=len(new_index),
        reverted=reverted, early=_early_updates(plans), budget_bytes=budget,
        budget=solution, loops=plans.get("loop bodies"), loops_v1=plans.get("loop bodies v1"),
        passes=plans, seconds=done.seconds)


def _run_passes(ws: Workspace, index, regions, facts, choice: CheckpointChoice,
                checkpoints: list[CheckpointFact], options: RewriteOptions) -> PipelineResult:
    """The rewrite pipeline (passes/pipeline.py) for one checkpoint choice."""
    return run_pipeline(PassContext(ws, options, index, choice, [c.name for c in checkpoints],
                                    regions, facts))


def _early_updates(plans: dict[str, PassPlan]) -> EarlyUpdatesPlan | None:
    """The early-updates plan as the report presents it: with the results of the schedule
    passes that run before it (IdentityN split, loop sums, last readers, late terms)."""
    early = plans.get("early updates")
    if early is None:
        return None
    early.split_identityn = plans["split IdentityN"].split
    late = plans["late terms"]
    early.late_terms, early.late_term_bytes = late.terms, late.bytes
    early.loop_sums_held = plans["loop sums"].held
    readers = plans["last readers"]
    early.last_readers, early.last_reader_bytes = readers.tensors, readers.bytes
    return early


@dataclass
class _Runner:
    """The rewrite of one checkpoint choice, as the budget search drives it (budget.py's
    PlanRunner): apply the passes, estimate, restore the original."""

    ws: Workspace
    index: object
    regions: object
    facts: object
    options: RewriteOptions
    restore: Callable[[], object]  # puts the original graph back

    def apply(self, choice: CheckpointChoice) -> tuple[list[CheckpointFact], PipelineResult]:
        checkpoints = _checkpoint_facts(self.index, choice.tensors, self.options.batch_size)
        return checkpoints, _run_passes(self.ws, self.index, self.regions, self.facts, choice,
                                        checkpoints, self.options)

    def held_ahead(self, applied) -> bool:
        recompute = applied[1].plans.get("recompute")
        return recompute is not None and any(s.ahead for s in recompute.segments)

    def ran_weight_grads_first(self, applied) -> bool:
        recompute = applied[1].plans.get("recompute")
        return recompute is not None and recompute.order_edges > 0

    def measure(self, applied) -> tuple[MemoryEstimate, int]:
        done = applied[1]
        return (_estimate(self.ws, done.regions, self.options),
                copied_flops(done.index, self.options.batch_size))


# Graphs with more nodes than this get the memory policy's heuristic plan alone (one apply
# and estimate instead of about eight): on them the tool's own time is what a user waits for.
MEMORY_SEARCH_NODES = 60_000


def _step_times(before_job: Background) -> StepTimes | None:
    """The original's modelled step times, from its estimate (None when its child failed:
    the memory policy then caps recompute by FLOPs alone)."""
    before = before_job.result()
    return before.step_times if before is not None else None


def _searches_memory(options: RewriteOptions, nodes: int) -> bool:
    """The memory policy tries the budget model's plans besides its heuristic's
    (passes/budget.py memory_candidates) unless checkpoints are named, tensors are swapped
    (the swap pass acts on the heuristic's checkpoints), or the graph is big enough that
    the search would dominate the tool's time."""
    return (not options.checkpoint_patterns and options.swap is None
            and nodes <= MEMORY_SEARCH_NODES)


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
    return _estimate(other, _regions(other, other.reindex(appended=False), options), options)


def _regions(ws: Workspace, index, options: RewriteOptions):
    return analyze_regions(index, options.backward_scopes, options.batch_size,
                           ws.collection("losses"))


def early_updates_peak(ws: Workspace, index, regions, facts, options: RewriteOptions) -> int:
    """Estimated peak of the graph with the early-updates pass alone (no recompute). Edits
    the workspace: the caller restores it."""
    none = CheckpointChoice("none", [])
    new_regions = _run_passes(ws, index, regions, facts, none, [], options).regions
    return estimate_step(ws, new_regions, options.batch_size, options.backward_scopes,
                         options.grappler).peak_bytes


def _checkpoint_facts(index, tensors, batch_size) -> list[CheckpointFact]:
    return [CheckpointFact(index.tensor_name(t), index.shape_at(t, batch_size),
                           dtypes.name(index.dtype(t) or 0),
                           index.tensor_bytes(t, batch_size))
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
