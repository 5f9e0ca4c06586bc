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
from graphmem.graph.workspace import Workspace
from graphmem.passes.checkpoints import CheckpointChoice, choose_checkpoints
from graphmem.passes.early_updates import EarlyUpdatesPlan, apply_early_updates
from graphmem.passes.recompute import RecomputePlan, apply_recompute
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
    choice = choose_checkpoints(options.policy, index, regions, facts, options.batch_size,
                                options.checkpoint_patterns, ws.collection("checkpoints"))
    checkpoints = [CheckpointFact(index.tensor_name(t), index.shape(t),
                                  dtypes.name(index.dtype(t) or 0),
                                  _bytes(index, t, options.batch_size))
                   for t in choice.tensors]
    nodes_before = len(index)
    original = ws.graph_def.__class__()
    original.CopyFrom(ws.graph_def)
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
        early = apply_early_updates(new_index, new_regions)
        if early.edges:
            new_index = ws.reindex()
            new_regions = analyze_regions(new_index, options.backward_scopes,
                                          options.batch_size, ws.collection("losses"))
    after = estimate_step(ws, new_regions, options.batch_size, options.backward_scopes,
                          options.grappler, keep_timeline=options.keep_timeline,
                          host_device=host)
    reverted = after.peak_bytes > before.peak_bytes and not options.keep_worse
    if reverted:  # never hand back a graph the estimate says is worse
        ws.graph_def.CopyFrom(original)
        new_index = ws.reindex()
    ws.commit()
    return RewriteResult(ws.model, choice, checkpoints, plan, swap_plan, before, after,
                         nodes_before, len(new_index), reverted, early)


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


def _bytes(index, t, batch_size):
    from graphmem.graph.index import nbytes

    return nbytes(index.shape(t), index.dtype(t), batch_size)


def rewrite_file(model_path: str | Path, out: str | Path, options: RewriteOptions,
                 fmt=None, tag=None, function=None) -> RewriteResult:
    ws = Workspace.open(load_model(model_path, fmt, tag, function),
                        batch_size=options.batch_size)
    result = rewrite_workspace(ws, options)
    save_model(ws.model, out)
    return result
