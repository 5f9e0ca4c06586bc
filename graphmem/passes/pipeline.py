"""The rewrite pipeline: the passes in their order, run under the contract of base.py.

Adding a pass: write it (a `Pass` in its module), add it to `REWRITE_PASSES` where it
belongs in the order, and present its plan in the report.

The pipeline re-indexes after a pass that edited nodes (a stale index is never handed to
the next pass), hands a pass that edits the index in place one the caller does not hold,
analyses regions only when asked for after a change, times every stage, and names the
pass in the traceback of an error raised inside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions
from graphmem.analysis.towers import check_collective_order, collectives
from graphmem.graph.index import GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan
from graphmem.passes.early_updates import EarlyUpdatesPass
from graphmem.passes.fusion_guard import FusionGuardPass
from graphmem.passes.in_place_terms import InPlaceTermsPass
from graphmem.passes.last_readers import LastReadersPass
from graphmem.passes.late_gradients import LateGradientsPass
from graphmem.passes.late_terms import LateTermsPass
from graphmem.passes.loop_recompute import LoopRecomputePass
from graphmem.passes.loop_recompute_v1 import LoopRecomputeV1Pass
from graphmem.passes.loop_sums import LoopSumsPass
from graphmem.passes.pool_first import PoolFirstPass
from graphmem.passes.reader_barriers import ReaderBarriersPass
from graphmem.passes.recompute import RecomputePass
from graphmem.passes.regroup_guard import RegroupGuardPass
from graphmem.passes.removed_ops_guard import RemovedOpsGuardPass
from graphmem.passes.split_identityn import SplitIdentityNPass
from graphmem.passes.swap import SwapPass

# the order matters: recompute plans on the original graph's saved activations; the loop
# passes then edit loop bodies (v2 functions, v1 frames) the copies left alone; swap moves
# what recompute kept; a max pooling's gradient then masks its incoming gradient before it
# scatters it (pool_first.py); large weight-decay terms are added into their gradients in
# pieces; an optimizer's IdentityN is split and v1 loop sums ordered; reader barriers then
# keep Grappler from folding the products and sums the passes left with one reader into
# that reader, once no later pass changes what reads what; the schedule passes (element-wise
# last readers, late weight-decay terms, early updates, and late weight gradients, which
# undo early updates where a gradient is far larger than its inputs) come next, as they
# order what the others made, and add control edges only; their edges are moved off the
# ops Grappler removes (which would keep them, and change what Grappler makes of the ops
# around) and off the sums and products Grappler regroups (which would round
# differently); the fusion guard checks the result as TF will run it, with ops it merges
# as one
REWRITE_PASSES: tuple[Pass, ...] = (
    RecomputePass(),
    LoopRecomputePass(),
    LoopRecomputeV1Pass(),
    SwapPass(),
    PoolFirstPass(),
    InPlaceTermsPass(),
    SplitIdentityNPass(),
    LoopSumsPass(),
    ReaderBarriersPass(),
    LastReadersPass(),
    LateTermsPass(),
    EarlyUpdatesPass(),
    LateGradientsPass(),
    RemovedOpsGuardPass(),
    RegroupGuardPass(),
    FusionGuardPass(),
)


@dataclass
class PipelineResult:
    plans: dict[str, PassPlan]  # pass name -> plan, for the passes that ran, in order
    index: GraphIndex  # of the rewritten graph
    regions: Regions  # of the rewritten graph
    seconds: dict[str, float] = field(default_factory=dict)  # stage -> wall seconds


def run_pipeline(context: PassContext,
                 passes: tuple[Pass, ...] = REWRITE_PASSES) -> PipelineResult:
    """Run the enabled passes over `context.ws` in order. The workspace's graph is edited
    in place; `context.ws.index` is the index of the result afterwards."""
    seconds: dict[str, float] = {}
    original = context.index  # never edited in place (PassContext), kept for the check
    for p in passes:
        if not p.enabled(context.options) or not p.applies(context):
            continue
        start = time.perf_counter()
        if p.edits in (Edits.CONTROL_EDGES, Edits.ATTRS):
            context.own_index()
        try:
            plan = p.run(context)
        except Exception as exc:
            exc.add_note(f"in the rewrite pass {p.name!r}")
            raise
        context.plans[p.name] = plan
        seconds[p.name] = time.perf_counter() - start
        if p.edits is Edits.NODES and plan.changed:
            start = time.perf_counter()
            context.reindex()
            seconds[f"re-index after {p.name}"] = time.perf_counter() - start
    if context.index is not original and collectives(original):
        start = time.perf_counter()
        check_collective_order(original, context.index)  # towers.py: refuses, or passes
        seconds["collective order"] = time.perf_counter() - start
    start = time.perf_counter()
    regions = context.regions
    seconds["regions"] = time.perf_counter() - start
    return PipelineResult(context.plans, context.index, regions, seconds)
