"""Estimated memory of one training step, by simulating the executor over the graph.

Ops run in the order TF's executor takes with one inter-op thread (see schedule.py), or in
the topological order when asked; each output buffer is allocated when its op runs and freed
after its last reader. Ops that forward their input (Identity, Reshape, ...) allocate
nothing; they extend the life of the buffer they forward. Variables, their reads and constants
are persistent and reported apart from the step's peak.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from graphmem.analysis.schedule import executor_order
from graphmem.analysis.variables import persistent_bytes
from graphmem.graph.index import VARIABLE_OPS, GraphIndex, Tensor

ALIASING_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "StopGradient",
                          "Snapshot", "PreventGradient", "IdentityN", "EnsureShape",
                          "RefIdentity", "CheckNumerics", "PlaceholderWithDefault"})
PERSISTENT_OPS = VARIABLE_OPS | {"Const", "HostConst", "ReadVariableOp", "_Arg"}
# Element-wise kernels that write into an input buffer when nothing else reads it any more
# (TF's forward_input_or_allocate_output).
FORWARDING_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Neg", "Exp", "Log", "Sqrt", "Rsqrt",
    "Square", "Abs", "Sign", "Reciprocal", "Softplus", "Erf", "Cast", "LeakyRelu",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "Maximum", "Minimum", "SquaredDifference",
    "DivNoNan", "MulNoNan", "BiasAdd", "AddN", "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad",
    "TanhGrad", "SigmoidGrad", "RsqrtGrad", "SqrtGrad", "SoftplusGrad", "LeakyReluGrad",
    "SelectV2", "Select", "FusedBatchNormV3", "Softmax", "LogSoftmax",
})


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
    timeline: list[int] = field(default_factory=list)  # bytes live while each op runs
    unknown_tensors: int = 0  # outputs whose size could not be known (counted as 0)
    host_peak_bytes: int = 0  # peak on the host device when it is excluded (swap)
    ops_in_step: int = 0


def estimate_memory(index: GraphIndex, batch_size: int | None = None,
                    keep_timeline: bool = False, top: int = 10,
                    order: list[int] | None = None,
                    nodes: set[int] | None = None,
                    schedule: str = "executor",
                    host_device: str | None = None) -> MemoryEstimate:
    """Simulate one step over `nodes` (default: the whole graph), in `order` if given, else
    in the executor's order (`schedule="executor"`) or the topological one ("topo").
    With `host_device`, buffers on that device are left out of the peak and reported as
    `host_peak_bytes` (the device being saved is everything else)."""
    if order is None:
        order = executor_order(index, nodes, batch_size) if schedule == "executor" \
            else index.topo
    if nodes is not None:
        order = [i for i in order if i in nodes]
    host = normalize_device(host_device) if host_device else None
    run = _simulate(index, order, batch_size, host, keep_timeline, track_lives=bool(top))
    live_at_peak: list[LiveTensor] = []
    if top and order:  # the buffers whose lifetime spans the peak
        at_peak = [(-b, born, buf) for buf, b, born, freed in run.lifetimes
                   if born <= run.peak_pos <= freed]
        at_peak.sort()  # largest first, then in the order they were allocated
        live_at_peak = [LiveTensor(index.tensor_name(buf), -b, index.shape(buf))
                        for b, _, buf in at_peak[:top]]
    return MemoryEstimate(run.peak, persistent_bytes(index), run.peak_pos,
                          index.names[order[run.peak_pos]] if order else "", live_at_peak,
                          run.peak_dev, run.timeline, run.unknown, run.host_peak, len(order))


@dataclass
class _Run:
    peak: int = 0
    peak_pos: int = 0
    host_peak: int = 0
    unknown: int = 0
    peak_dev: dict[str, int] = field(default_factory=dict)
    timeline: list[int] = field(default_factory=list)
    # (buffer, bytes, position allocated, position freed) of device buffers; a buffer is
    # live while the op at its freeing position runs, and to the end if never freed
    lifetimes: list[tuple[Tensor, int, int, int]] = field(default_factory=list)


def _simulate(index: GraphIndex, order: list[int], batch_size: int | None, host: str | None,
              keep_timeline: bool, track_lives: bool = False) -> _Run:
    """One pass over `order` with reference-counted buffers. Linear in the graph: rather
    than listing the live set at every new peak, it records each buffer's lifetime
    (`track_lives`), from which the live set at the final peak is read afterwards.

    Tensors are numbered (`first[i] + k` for output k of node i) so that the per-buffer
    state lives in flat lists: dicts keyed by (node, output) tuples cost twice as much on
    100k-node graphs. A buffer is named by the tensor that allocated it."""
    run = _Run()
    n = len(index)
    member = bytearray(n)
    for i in order:
        member[i] = 1
    normal: dict[str, str] = {}
    device_of = [normal[d] if d in normal else normal.setdefault(d, normalize_device(d))
                 for d in index.devices]
    ops, data_inputs, num_outputs = index.ops, index.data_inputs, index.num_outputs
    first = [0] * n
    total = 0
    for i in range(n):
        first[i] = total
        total += num_outputs[i]
    readers = [0] * total  # reads each tensor gets from ops in the step
    for (src, k), found in index.consumers.items():
        if member[src]:
            count = 0
            for c in found:
                count += member[c]
            readers[first[src] + k] = count
    buffer_of = [-1] * total  # tensor -> the buffer holding it (-1: not produced yet)
    pending = [0] * total  # per buffer: reads still to come
    size = [-1] * total  # per buffer: bytes while live, -1 when not live
    born: dict[int, int] = {}  # buffer -> position allocated (track_lives)
    live = 0
    live_dev: dict[str, int] = {}
    sizes_of = index.output_bytes(batch_size)
    for p, i in enumerate(order):
        op = ops[i]
        dev = device_of[i]
        inputs = [first[s] + k for s, k in data_inputs[i] if member[s]]
        aliasing = op in ALIASING_OPS and bool(inputs)
        persistent = op in PERSISTENT_OPS or (op == "Identity" and _reads_variable(index, i))
        forwarding = op in FORWARDING_OPS
        sizes = sizes_of(i)
        base = first[i]
        taken: set[int] = set()
        for k in range(num_outputs[i]):
            t = base + k
            src = _aliased_input(op, k, inputs) if aliasing else -1
            if src >= 0 and buffer_of[src] >= 0 and device_of[_node_of(first, src)] == dev:
                buf = buffer_of[src]  # an identity across devices is a copy: it allocates
                buffer_of[t] = buf
                pending[buf] += readers[t]
                continue
            b = sizes[k]
            if b is None:
                run.unknown += 1
                b = 0
            if persistent:
                b = 0
            donor = _forwardable(inputs, buffer_of, pending, size, b, taken) \
                if b and forwarding else -1
            if donor >= 0:  # TF reuses an input buffer that this op reads last
                taken.add(donor)
                buffer_of[t] = donor
                pending[donor] += readers[t]
                continue
            buffer_of[t] = t
            size[t] = b
            pending[t] = readers[t]
            if track_lives and b and dev != host:
                born[t] = p
            if b:
                live_dev[dev] = live_dev.get(dev, 0) + b
                if dev == host:
                    run.host_peak = max(run.host_peak, live_dev[dev])
                else:
                    live += b
        if keep_timeline:
            run.timeline.append(live)
        if live > run.peak:
            run.peak, run.peak_pos = live, p
        if live_dev.get(dev, 0) > run.peak_dev.get(dev, 0):
            run.peak_dev[dev] = live_dev[dev]
        touched = set()
        for t in inputs:  # one read per input slot
            buf = buffer_of[t]
            if buf >= 0:
                pending[buf] -= 1
                touched.add(buf)
        for t in range(base, base + num_outputs[i]):
            buf = buffer_of[t]
            if buf >= 0:
                touched.add(buf)
        for buf in touched:
            b = size[buf]
            if b >= 0 and pending[buf] <= 0:
                size[buf] = -1
                pending[buf] = 0
                if buf in born:
                    run.lifetimes.append((_tensor_of(first, buf), b, born.pop(buf), p))
                if b:
                    d = device_of[_node_of(first, buf)]
                    live_dev[d] -= b
                    if d != host:
                        live -= b
    end = len(order)
    run.lifetimes.extend((_tensor_of(first, buf), size[buf], p, end) for buf, p in born.items())
    return run


def _node_of(first: list[int], t: int) -> int:
    """The node whose outputs include tensor number t (the last node starting at or before
    it: nodes without outputs share their successor's start)."""
    return bisect_right(first, t) - 1


def _tensor_of(first: list[int], t: int) -> Tensor:
    i = _node_of(first, t)
    return (i, t - first[i])


def _aliased_input(op: str, k: int, inputs: list[int]) -> int:
    if op == "IdentityN":
        return inputs[k] if k < len(inputs) else -1
    return inputs[0] if k == 0 else -1


def _forwardable(inputs: list[int], buffer_of: list[int], pending: list[int], size: list[int],
                 nbytes_out: int, taken: set[int]) -> int:
    """An input buffer of the same size read for the last time here, which TF's element-wise
    kernels (FORWARDING_OPS) take over as their output instead of allocating (-1: none)."""
    for t in inputs:
        buf = buffer_of[t]
        if buf < 0 or buf in taken or size[buf] != nbytes_out:
            continue
        reads_here = sum(1 for u in inputs if buffer_of[u] == buf)
        if pending[buf] == reads_here:
            return buf
    return -1


def _reads_variable(index: GraphIndex, i: int) -> bool:
    ins = index.data_inputs[i]
    return bool(ins) and index.ops[ins[0][0]] in VARIABLE_OPS


def normalize_device(device: str) -> str:
    """'/job:localhost/replica:0/task:0/device:CPU:0', '/cpu:0' -> '/device:CPU:0'."""
    if not device:
        return ""
    tail = device.rsplit("/", 1)[-1]
    if tail.lower().startswith("device:"):
        tail = tail[len("device:"):]
    kind, _, number = tail.partition(":")
    return f"/device:{kind.upper()}:{number or '0'}"
