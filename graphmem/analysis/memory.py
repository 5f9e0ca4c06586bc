"""Estimated memory of one training step, by simulating the executor over the graph.

Ops run in the index's topological order (the order a one-thread executor takes when every op
runs as soon as its inputs are ready); each output buffer is allocated when its op runs and
freed after its last reader. Ops that forward their input (Identity, Reshape, ...) allocate
nothing; they extend the life of the buffer they forward. Variables, their reads and constants
are persistent and reported apart from the step's peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.variables import persistent_bytes
from graphmem.graph.index import VARIABLE_OPS, GraphIndex, nbytes

ALIASING_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "StopGradient",
                          "Snapshot", "PreventGradient", "IdentityN", "EnsureShape",
                          "RefIdentity", "CheckNumerics", "PlaceholderWithDefault"})
PERSISTENT_OPS = VARIABLE_OPS | {"Const", "HostConst", "ReadVariableOp", "_Arg"}


@dataclass
class LiveTensor:
    name: str
    bytes: int
    shape: list[int] | None


@dataclass
class MemoryEstimate:
    peak_bytes: int  # the step's peak above persistent memory (all devices)
    persistent_bytes: int
    peak_position: int  # index into the execution order
    peak_op: str  # the op running at the peak
    live_at_peak: list[LiveTensor] = field(default_factory=list)  # largest first
    peak_by_device: dict[str, int] = field(default_factory=dict)
    timeline: list[int] = field(default_factory=list)  # bytes live after each op
    unknown_tensors: int = 0  # outputs whose size could not be known (counted as 0)


def estimate_memory(index: GraphIndex, batch_size: int | None = None,
                    keep_timeline: bool = False, top: int = 10,
                    order: list[int] | None = None,
                    nodes: set[int] | None = None) -> MemoryEstimate:
    """Simulate one step over `nodes` (default: the whole graph) in `order`."""
    order = order if order is not None else index.topo
    if nodes is not None:
        order = [i for i in order if i in nodes]
    pos = {node: p for p, node in enumerate(order)}
    n_steps = len(order)
    # buffer id per tensor: aliasing ops map output 0 to their input 0's buffer
    buffer_of: dict[tuple[int, int], tuple[int, int]] = {}
    size: dict[tuple[int, int], int] = {}
    persistent = persistent_bytes(index)
    unknown = 0
    for i in order:
        op = index.ops[i]
        for k in range(index.num_outputs[i]):
            t = (i, k)
            if op in ALIASING_OPS and index.data_inputs[i] and k < len(index.data_inputs[i]):
                src = index.data_inputs[i][k if op == "IdentityN" else 0]
                buffer_of[t] = buffer_of.get(src, src)
                continue
            buffer_of[t] = t
            b = nbytes(index.shape(t), index.dtype(t), batch_size)
            if b is None:
                unknown += 1
                b = 0
            if op in PERSISTENT_OPS or (op in ("Identity",) and _reads_variable(index, i)):
                b = 0
            size[t] = b
    # last use of each buffer, in execution positions
    last_use: dict[tuple[int, int], int] = {}
    for t, buf in buffer_of.items():
        p = pos.get(t[0], -1)
        if last_use.get(buf, -1) < p:
            last_use[buf] = p
        for c in index.consumers.get(t, ()):
            pc = pos.get(c, -1)
            if last_use.get(buf, -1) < pc:
                last_use[buf] = pc
    frees: list[list[tuple[int, int]]] = [[] for _ in range(n_steps)]
    for buf, p in last_use.items():
        if buf in size and 0 <= p < n_steps:
            frees[p].append(buf)
    device_of = index.devices
    live = 0
    live_dev: dict[str, int] = {}
    peak_dev: dict[str, int] = {}
    peak, peak_pos = 0, 0
    timeline: list[int] = []
    for p, i in enumerate(order):
        dev = device_of[i] or ""
        for k in range(index.num_outputs[i]):
            b = size.get((i, k), 0)
            if b:
                live += b
                live_dev[dev] = live_dev.get(dev, 0) + b
        if live > peak:
            peak, peak_pos = live, p
        if live_dev.get(dev, 0) > peak_dev.get(dev, 0):
            peak_dev[dev] = live_dev[dev]
        for buf in frees[p]:
            b = size[buf]
            if b:
                live -= b
                d = device_of[buf[0]] or ""
                live_dev[d] -= b
        if keep_timeline:
            timeline.append(live)
    live_at_peak = _live_at(index, order, pos, size, last_use, peak_pos, top)
    return MemoryEstimate(peak, persistent, peak_pos, index.names[order[peak_pos]] if order else "",
                          live_at_peak, peak_dev, timeline, unknown)


def _reads_variable(index: GraphIndex, i: int) -> bool:
    ins = index.data_inputs[i]
    return bool(ins) and index.ops[ins[0][0]] in VARIABLE_OPS


def _live_at(index, order, pos, size, last_use, at: int, top: int) -> list[LiveTensor]:
    live = []
    for buf, b in size.items():
        if b and pos.get(buf[0], 1 << 60) <= at <= last_use.get(buf, -1):
            live.append(LiveTensor(index.tensor_name(buf), b, index.shape(buf)))
    live.sort(key=lambda t: -t.bytes)
    return live[:top]
