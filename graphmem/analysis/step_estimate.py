"""Estimate one training step's memory for a workspace, on its own graph or on the graph
Grappler will make of it (`grappler=True`, TF1 graphs, needs TensorFlow)."""

from __future__ import annotations

from graphmem.analysis.broadcast_grads import folded_readers, folded_shape_ops
from graphmem.analysis.identity_bypass import bypassed_identityn
from graphmem.analysis.memory import MemoryEstimate, estimate_memory
from graphmem.analysis.pruning import unread_ops
from graphmem.analysis.regions import Regions, analyze_regions
from graphmem.errors import UsageError
from graphmem.graph.identityn import split_identityn
from graphmem.graph.index import CONTROL_FLOW_V2, GraphIndex
from graphmem.graph.workspace import Workspace


def estimate_step(ws: Workspace, regions: Regions, batch_size: int | None,
                  backward_scopes=None, grappler: bool = False, top: int = 10,
                  keep_timeline: bool = False, host_device: str | None = None
                  ) -> MemoryEstimate:
    index = ws.index
    if not grappler:
        # the graph as Grappler will run it, as far as graphmem can tell without TF: ops
        # Grappler folds or prunes do not run (and hold nothing)
        step = regions.step_nodes(index)
        barriers = bypassed_identityn(index, step)
        if barriers:
            index, step = _without_barriers(ws, index, step, barriers)
        folded = folded_shape_ops(index, step, batch_size)
        bypassed = None
        if folded:
            bypassed = folded_readers(index, step, folded)
            step = step - folded
        unread = unread_ops(index, step, (t[0] for t in regions.loss))
        return estimate_memory(index, batch_size, top=top,
                               nodes=step - unread if unread else step, bypassed=bypassed,
                               keep_timeline=keep_timeline, host_device=host_device,
                               library=ws.model.graph_def.library)
    if ws.view is not None:
        raise UsageError("--grappler estimates TF1 graphs; TF2 train steps are optimized "
                         "when TensorFlow loads them")
    from graphmem.runtime.grappler import grappler_graph
    from graphmem.runtime.shape_inference import infer_shapes

    fetches = ws.collection("train_op") or [index.names[i] for i in _sinks(index, regions)]
    graph = grappler_graph(ws.model.meta_graph, ws.graph_def, fetches)
    optimized = GraphIndex.build(graph, ws.registry)
    shapes, types = infer_shapes(graph, batch_size)
    optimized.set_shapes(shapes, types, override=True)
    optimized.set_shapes(_loop_shapes(index), {}, override=True)
    opt_regions = analyze_regions(optimized, backward_scopes, batch_size)
    return estimate_memory(optimized, batch_size, top=top,
                           nodes=opt_regions.step_nodes(optimized), keep_timeline=keep_timeline,
                           host_device=host_device)


def _without_barriers(ws: Workspace, index: GraphIndex, step: set[int],
                      barriers: list[int]) -> tuple[GraphIndex, set[int]]:
    """The graph with the IdentityN ops Grappler bypasses split (analysis/identity_bypass.py),
    as TensorFlow runs it, indexed apart from the workspace's, and the step on it. A copy:
    the workspace's graph is the user's (or a pass's) and stays as it is. The copy only
    gains nodes, so its index reuses the per-node facts (shapes TensorFlow inferred
    included) and its node ids are the workspace's; the new Identity ops join the step,
    the IdentityN ops leave it (nothing reads them)."""
    graph = type(index.graph_def)()
    graph.CopyFrom(index.graph_def)
    split_identityn(graph, index, barriers)
    split = GraphIndex.build(graph, ws.registry, index)
    return split, (step - set(barriers)) | set(range(len(index), len(split)))


def _loop_shapes(index: GraphIndex) -> dict[str, list]:
    """Shapes the graph carries, by name, for graphs with loops. TensorFlow's shape
    inference of a bare GraphDef leaves most of a loop body unknown (a Merge waits for its
    back edge, a lowered v2 loop's lists lose their element shapes, and what follows the
    loop inherits the gap), while the graph as built kept them; Grappler keeps most
    names. Graphs without loops are left to the inference alone."""
    if not any(index.frame) and not any(op in CONTROL_FLOW_V2 for op in set(index.ops)):
        return {}
    found = {}
    for i in range(len(index)):
        shapes = index.shapes_of(i)
        if shapes is not None:
            found[index.names[i]] = shapes
    return found


def _sinks(index: GraphIndex, regions: Regions) -> list[int]:
    return [i for i in regions.optimizer
            if not index.data_consumers(i) and not index.control_consumers[i]]
