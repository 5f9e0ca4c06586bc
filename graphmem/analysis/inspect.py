"""The facts `graphmem inspect` presents, gathered in one place and JSON-ready."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from graphmem.analysis.batch import missing_batch_message, resolve_batch_size
from graphmem.analysis.floor import Floor, step_floor
from graphmem.analysis.regions import Regions, analyze_regions
from graphmem.analysis.step_estimate import estimate_step
from graphmem.analysis.variables import find_variables
from graphmem.graph import dtypes
from graphmem.graph.index import CONTROL_FLOW_V2
from graphmem.graph.workspace import Workspace


@dataclass
class TensorFact:
    name: str
    shape: list[int] | None
    dtype: str
    bytes: int | None


@dataclass
class Untouched:
    what: str
    count: int
    why: str
    examples: list[str] = field(default_factory=list)


@dataclass
class InspectFacts:
    model: dict
    nodes: int
    regions: dict[str, int]
    top_op_types: list[tuple[str, int]]
    loss: list[str]
    saved_activations: dict
    variables: dict
    devices: dict[str, int]
    control_flow: dict
    # None when sizes depend on a batch dimension nothing fixes: no peak from unknown sizes
    estimated_peak_bytes: int | None
    persistent_bytes: int | None
    peak: dict | None
    untouched: list[Untouched]
    batch_size: int | None
    shapes_from: str
    batch_from: str  # "--batch-size", "signature", "not needed" or "unknown"
    sizes_unknown: str | None  # why byte counts are unknown (asks for --batch-size)
    estimated_on: str  # "graph" or "grappler"
    timeline: list[int] = field(default_factory=list)
    estimate_notes: list[str] = field(default_factory=list)  # where the estimate may be short
    # the step peak no recompute or swap plan can go under (analysis/floor.py): bytes, the
    # op whose footprint sets it, and its parts
    floor: dict = field(default_factory=dict)


def gather_facts(ws: Workspace, batch_size: int | None, backward_scopes=None,
                 top: int = 10, grappler: bool = False,
                 keep_timeline: bool = False) -> tuple[InspectFacts, Regions]:
    """Counts always; sizes and the estimated peak only when no size depends on a batch
    dimension nothing fixes (then they are None and `sizes_unknown` says why)."""
    batch = resolve_batch_size(ws, batch_size)
    batch_size = batch.size
    index = ws.index
    regions = analyze_regions(index, backward_scopes, batch_size, ws.collection("losses"))
    if ws.refine_shapes(regions.step_nodes(index), batch_size):
        regions = analyze_regions(index, backward_scopes, batch_size, ws.collection("losses"))
    saved = sorted(regions.saved, key=lambda s: -(s.bytes or 0))
    variables = find_variables(index)
    frames = index.frames()
    v2 = [index.names[i] for i in range(len(index)) if index.ops[i] in CONTROL_FLOW_V2]
    mem = None if batch.needed else estimate_step(ws, regions, batch_size, backward_scopes,
                                                  grappler, top, keep_timeline)
    devices = Counter(d or "(unplaced)" for d in index.devices)
    untouched: list[Untouched] = []
    if frames or v2:
        loop_nodes = sum(frames.values()) + len(v2)
        untouched.append(Untouched(
            "control-flow ops", loop_nodes,
            "loops and conditionals are treated as units: never split or recomputed "
            "(inside v2 loop bodies, rewrite rebuilds accumulated values: --loop-bodies)",
            sorted(frames)[:5] + v2[:5]))
    stateful_fwd = sorted(index.names[i] for i in regions.forward
                          if index.stateful[i] and index.ops[i] not in ("VarHandleOp",
                                                                       "VariableV2", "_Arg"))
    if stateful_fwd:
        untouched.append(Untouched(
            "stateful forward ops", len(stateful_fwd),
            "random ops, variable reads and queues are never recomputed (their outputs are kept)",
            stateful_fwd[:5]))
    unknown = regions.unknown_size
    if unknown and not batch.needed:  # else all sizes are unknown, and said so once
        untouched.append(Untouched(
            "saved activations of unknown size", len(unknown),
            "their shapes are not static; pass --batch-size to size an unknown batch dimension",
            [s.name for s in unknown[:5]]))
    model = ws.model
    facts = InspectFacts(
        model={"path": str(model.path), "format": model.format.value, "tags": list(model.tags),
               "function": model.function_name},
        nodes=len(index),
        regions={"forward": len(regions.forward), "backward": len(regions.backward),
                 "optimizer": len(regions.optimizer),
                 "state_updates": len(regions.state_updates), "other": len(regions.other)},
        top_op_types=Counter(index.ops).most_common(top),
        loss=[index.tensor_name(t) for t in regions.loss],
        saved_activations={
            "count": len(saved),
            "total_bytes": None if batch.needed else regions.saved_bytes,
            "unknown_size_count": len(unknown),
            "unknown_size": [s.name for s in unknown],
            "largest": [TensorFact(s.name, s.shape, dtypes.name(s.dtype or 0), s.bytes)
                        for s in saved[:top]],
        },
        variables={"count": len(variables), "total_bytes": sum(v.bytes or 0 for v in variables),
                   "largest": sorted(variables, key=lambda v: -(v.bytes or 0))[:top]},
        devices=dict(devices),
        control_flow={"v1_frames": frames, "v2_ops": v2, "loops": mem.loops if mem else []},
        estimated_peak_bytes=mem.estimated_bytes if mem else None,
        persistent_bytes=mem.persistent_bytes if mem else None,
        peak=None if mem is None else {
            "op": mem.peak_op, "position": mem.peak_position, "of": mem.ops_in_step,
            "phase": mem.phase, "live": mem.live_at_peak,
            "unknown_tensors": mem.unknown_tensors, **order_spread(mem)},
        untouched=untouched,
        batch_size=batch_size,
        shapes_from="tensorflow" if ws.shapes_from_tensorflow else "graph",
        batch_from=batch.source,
        sizes_unknown=missing_batch_message(batch) if batch.needed else None,
        estimated_on="grappler" if grappler else "graph",
        timeline=mem.timeline if mem else [],
        estimate_notes=mem.notes if mem else [],
        floor=floor_facts(step_floor(index, regions, batch_size, model.graph_def.library))
        if mem else {},
    )
    return facts, regions


def floor_facts(floor: Floor) -> dict:
    """The floor as inspect's and plan's JSON show it."""
    return {"bytes": floor.bytes, "op": floor.op,
            "parts": [{"name": p.name, "bytes": p.bytes, "role": p.role}
                      for p in floor.parts]}


def order_spread(mem) -> dict:
    """The peak's spread over TF's executor orders, for reports: the highest (a training
    run's peak, the one gates use) and the lowest, each with its phase and walk (how the
    order takes TF's ready ops, schedule.py's WALK_*), and every order walked."""
    return {"highest_bytes": mem.estimated_bytes, "highest_phase": mem.phase,
            "highest_threads": mem.highest_threads, "highest_walk": mem.highest_walk,
            "ranking_bytes": mem.peak_bytes,
            "lowest_bytes": mem.lowest_peak_bytes, "lowest_phase": mem.lowest_phase,
            "lowest_walk": mem.lowest_walk,
            "orders": [{"phase": o.phase, "threads": o.threads, "walk": o.walk,
                        "peak_bytes": o.peak_bytes, "peak_op": o.peak_op}
                       for o in mem.orders]}

