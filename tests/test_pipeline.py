"""The rewrite pipeline (passes/pipeline.py) under its contract (passes/base.py): passes
run in order when the options ask for them, the index is rebuilt only after a pass that
edited nodes, the caller's index is never edited in place, and errors name the pass."""

from __future__ import annotations

import pytest

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.regions import analyze_regions
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan
from graphmem.passes.checkpoints import CheckpointChoice, choose_checkpoints
from graphmem.passes.pipeline import REWRITE_PASSES, run_pipeline
from graphmem.rewrite import RewriteOptions
from tests.conftest import fixture_path

BATCH = 32


def _context(options: RewriteOptions, policy: str | None = None) -> PassContext:
    ws = Workspace.open(load_model(fixture_path("mlp")), batch_size=BATCH)
    regions = analyze_regions(ws.index, None, BATCH, ws.collection("losses"))
    facts = analyze_forward(ws.index, regions, set())
    policy = policy or options.policy
    choice = CheckpointChoice("none", []) if policy == "none" else \
        choose_checkpoints(policy, ws.index, regions, facts, BATCH)
    names = [ws.index.tensor_name(t) for t in choice.tensors]
    return PassContext(ws, options, ws.index, choice, names, regions, facts)


def test_the_passes_have_distinct_names_and_declared_edits():
    names = [p.name for p in REWRITE_PASSES]
    assert len(set(names)) == len(names)
    assert all(isinstance(p.edits, Edits) for p in REWRITE_PASSES)
    # the schedule passes that only add (and the fusion guard, that removes) control edges
    # come after every pass adding nodes
    kinds = [p.edits for p in REWRITE_PASSES]
    assert kinds.index(Edits.CONTROL_EDGES) > max(
        k for k, e in enumerate(kinds) if e is Edits.NODES)


def test_memory_policy_runs_recompute_and_the_schedule_passes():
    context = _context(RewriteOptions("memory", batch_size=BATCH))
    given = context.index
    nodes = len(given)
    result = run_pipeline(context)
    assert list(result.plans) == ["recompute", "loop bodies", "in-place terms",
                                  "split IdentityN", "loop sums", "reader barriers",
                                  "last readers", "late terms", "early updates",
                                  "removed ops guard", "regroup guard", "fusion guard"]
    assert all(isinstance(plan, PassPlan) for plan in result.plans.values())
    assert result.plans["recompute"].changed and result.plans["recompute"].copied_ops > 0
    assert "swap" not in result.plans  # not asked for
    assert "loop bodies v1" not in result.plans  # asked for, but the MLP has no v1 loop
    assert result.index is context.ws.index and len(result.index) > nodes  # re-indexed
    assert result.seconds["recompute"] >= 0 and "re-index after recompute" in result.seconds
    assert result.plans["early updates"].updates > 0


def test_a_control_edge_pass_never_edits_the_callers_index():
    context = _context(RewriteOptions("none", batch_size=BATCH))
    given = context.index
    edges = sum(len(c) for c in given.control_inputs)
    result = run_pipeline(context)
    assert result.plans["early updates"].edges > 0
    assert result.index is not given  # a new index took the edges
    assert sum(len(c) for c in given.control_inputs) == edges
    assert sum(len(c) for c in result.index.control_inputs) > edges


class _Recorder(Pass):
    """A pass that edits nothing, or raises."""

    edits = Edits.NODES

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name, self.fail, self.seen = name, fail, []

    def run(self, context: PassContext) -> PassPlan:
        self.seen.append(context.index)
        if self.fail:
            raise ValueError("boom")
        return _Nothing()


class _Nothing(PassPlan):
    changed = False


def test_no_reindex_after_a_pass_that_changed_nothing():
    context = _context(RewriteOptions("none", batch_size=BATCH))
    first, second = _Recorder("first"), _Recorder("second")
    result = run_pipeline(context, (first, second))
    assert second.seen == [first.seen[0]] and result.index is first.seen[0]
    assert list(result.plans) == ["first", "second"]


def test_an_error_names_the_pass():
    context = _context(RewriteOptions("none", batch_size=BATCH))
    with pytest.raises(ValueError) as err:
        run_pipeline(context, (_Recorder("ok"), _Recorder("broken", fail=True)))
    assert any("'broken'" in note for note in err.value.__notes__)
