"""Estimated memory of one training step, by simulating the executor over the graph.

Ops run in the order TF's executor takes with one inter-op thread (see schedule.py), or in
the topological order when asked; each output buffer is allocated when its op runs and freed
after its last reader. Ops that forward their input (Identity, Reshape, ...) allocate
nothing; they extend the life of the buffer they forward. Variables, their reads and constants
are persistent and reported apart from the step's peak, except when an update writes a
variable a pending read still shares (copy on write, below). Buffers are counted as TF's BFC
allocator rounds them (multiples of 256 bytes); which ops run at all is the caller's `nodes`
(estimate.py leaves out what Grappler turns into NoOps, analysis/pruning.py).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import partial
from itertools import compress

from google.protobuf.message import Message

from graphmem.analysis.bfc import ADOPT, UNRANKED, replay_step
from graphmem.analysis.broadcast_grads import forwarding_reductions
from graphmem.analysis.kernel_scratch import has_scratch, onednn_enabled, scratch_model
from graphmem.analysis.loops import (
    ELEMENT_VIEW_OUTPUT,
    Loop,
    LoopFacts,
    allocation_bytes,
    analyze_loops,
    element_view,
)
from graphmem.analysis.onednn_workspaces import Workspaces, onednn_workspaces
from graphmem.analysis.schedule import (
    WALK_GIVEN,
    WALK_STEADY,
    WALK_TOPOLOGICAL,
    WALK_TWO_THREADS,
    StepTimes,
    executor_walks,
    two_thread_order,
)
from graphmem.analysis.variables import constant_initialized, persistent_buffers
from graphmem.background import Background
from graphmem.graph import dtypes
from graphmem.graph.devices import normalize_device
from graphmem.graph.index import VARIABLE_OPS, GraphIndex, Tensor

ALIASING_OPS = frozenset({"Identity", "Reshape", "ExpandDims", "Squeeze", "StopGradient",
                          "Snapshot", "PreventGradient", "IdentityN", "EnsureShape",
                          "RefIdentity", "CheckNumerics", "PlaceholderWithDefault",
                          # control flow v1 passes tensors on without copying them. A
                          # Merge is left out: the simulation runs a loop body once, as its
                          # last iteration, whose Merge yields the previous iteration's
                          # value, a buffer of its own
                          "Enter", "RefEnter", "Exit", "RefExit", "NextIteration",
                          "RefNextIteration", "LoopCond", "Switch", "RefSwitch",
                          "StackPushV2",
                          # adds into its first input's buffer (passes/in_place_terms.py)
                          "InplaceAdd"})
_BACK_EDGES = frozenset({"NextIteration", "RefNextIteration"})
_POP_OUTPUT = {"TensorListPopBack": 1}  # the popped element (StackPopV2: output 0)
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
# Kernels that write into their first input's buffer when nothing else reads it any more,
# and never into another input's: a max pooling's gradient on the CPU with Eigen's kernels
# (its first input is the pooled tensor, as large as its output; passes/pool_first.py leaves
# it the last reader). oneDNN's pooling gradient allocates its output.
FIRST_INPUT_FORWARDING_OPS = frozenset({"MaxPoolGrad"})
# Kernels that write a resource variable in place (TF's PrepareToUpdateVariable, or the
# buffer swap of AssignVariableOp). A ReadVariableOp's output is the variable's own buffer;
# when such a read is still to be consumed, the update cannot write into that buffer: the
# variable gets a new one and the old buffer stays alive, held by the read, until the
# read's last consumer ran (copy on write). TF2 tape steps hit this: a variable's update
# runs as soon as its gradient is ready, before the backward op that still reads the
# forward read (dx = dy . W^T).
_UPDATE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})


def updates_variable(op: str) -> bool:
    """Whether op writes (dense) into the resource variables it takes as inputs."""
    return op in _UPDATE_OPS or op.startswith("ResourceApply")


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
    loops: list[Loop] = field(default_factory=list)  # trip counts and how they were found
    notes: list[str] = field(default_factory=list)  # where the estimate is known to be short
    # the executor's phase the peak is in: "steady" or "warm-up" (its first ~90 steps, when
    # TF dispatches small ops as tasks; see schedule.py)
    phase: str = "steady"
    walk: str = WALK_STEADY  # how that order takes the ready ops (schedule.py's WALK_*)
    # the peak of each executor order simulated (one when the order was given): TF's order
    # changes from process to process and from warm-up to steady state, and so does the
    # peak. `peak_bytes` is the highest of them (and `estimated_bytes` the highest step of
    # any of them, the one a training run reaches)
    orders: list[OrderPeak] = field(default_factory=list)
    # the highest step of the replays (bfc.py): above `peak_bytes` when variables take
    # over buffers (Keras' slots), which moves the allocator's chunks every step. The
    # estimate reported (`estimated_bytes`); `peak_bytes` (variables kept in their
    # chunks, the same every step) ranks plans
    highest_bytes: int = 0
    # inter-op threads of the order whose step is the highest (2: two threads running ops
    # side by side reach a peak no one-thread order does)
    highest_threads: int = 1
    # with a timeline: the ops in the order walked (`timeline[p]` is while `order[p]` runs)
    order: list[int] = field(default_factory=list)
    # the step's modelled running time at one and two inter-op threads (schedule.py), when
    # the two-thread order was walked: what the memory policy weighs plans' step time by
    step_times: StepTimes | None = None

    @property
    def estimated_bytes(self) -> int:
        """The peak a training run can reach: the highest replayed step of any order."""
        return max(self.peak_bytes, self.highest_bytes)

    @property
    def lowest_peak_bytes(self) -> int:
        """The lowest peak over the orders simulated: a run may peak this low."""
        return min((o.peak_bytes for o in self.orders), default=self.peak_bytes)

    def _lowest_order(self) -> OrderPeak | None:
        return min(self.orders, key=lambda o: o.peak_bytes, default=None)

    @property
    def lowest_phase(self) -> str:
        """The phase of the order with the lowest peak."""
        low = self._lowest_order()
        return low.phase if low is not None else self.phase

    @property
    def highest_walk(self) -> str:
        """How the order of the highest step takes the ready ops: two threads' walk when
        that step is theirs (`highest_threads`), else the walk of the order `phase` names."""
        return WALK_TWO_THREADS if self.highest_threads == 2 else self.walk

    @property
    def lowest_walk(self) -> str:
        """How the order with the lowest peak takes the ready ops."""
        low = self._lowest_order()
        return low.walk if low is not None else self.walk


@dataclass
class OrderPeak:
    """One executor order the simulation walked: its phase, its peak and where."""

    phase: str  # "steady" or "warm-up"
    peak_bytes: int
    peak_op: str
    threads: int = 1  # inter-op threads: 2 for the order two threads run (schedule.py)
    walk: str = WALK_STEADY  # how it takes the ready ops (schedule.py's WALK_*)


def loop_body_peak(body: GraphIndex, batch_size: int | None, library: Message,
                   depth: int) -> int:
    """Peak of one iteration of a v2 loop body, for the loop facts (loops.analyze_loops).
    Requested bytes: the body's buffers live inside the step's allocator."""
    return estimate_memory(body, batch_size, top=0, library=library, allocator=False,
                           _loop_depth=depth).peak_bytes


def estimate_memory(index: GraphIndex, batch_size: int | None = None,
                    keep_timeline: bool = False, top: int = 10,
                    order: list[int] | None = None,
                    nodes: set[int] | None = None,
                    schedule: str = "executor",
                    host_device: str | None = None, library: Message | None = None,
                    onednn: bool | None = None, allocator: bool = True,
                    bypassed: set[int] | None = None, two_threads: bool = True,
                    _loop_depth: int = 0) -> MemoryEstimate:
    """Simulate one step over `nodes` (default: the whole graph), in `order` if given, else
    in the executor's orders (`schedule="executor"`: its warm-up and steady-state orders,
    keeping the higher peak, whose phase the estimate names) or the topological one
    ("topo").
    With `host_device`, buffers on that device are left out of the peak and reported as
    `host_peak_bytes` (the device being saved is everything else). `library` holds the
    bodies of v2 While ops (default: the graph's own library); loops are sized by
    loops.analyze_loops. Kernels' scratch buffers are counted while they run, for the CPU
    kernels TF picks with oneDNN on or off (`onednn`, default: as on this machine; see
    kernel_scratch.py). Peaks count the chunks TF's allocator hands out (`allocator`, see
    bfc.py), not the bytes asked for. Ops in `bypassed` are ones Grappler removes (they
    take no turn in the executor's order, see schedule.py). `two_threads`: also walk the
    order two inter-op threads run (schedule.py), whose peak counts only in the highest
    (`estimated_bytes`)."""
    host = normalize_device(host_device) if host_device else None
    loops = analyze_loops(index, batch_size, library, _loop_depth, loop_body_peak)
    variables = persistent_buffers(index)
    on = onednn if onednn is not None else onednn_enabled()
    run_in = _Simulation(index, batch_size, host, keep_timeline, top, loops,
                         scratch_model(index, batch_size, on, library=library),
                         allocator,
                         forwarding_reductions(index, nodes, batch_size), variables, nodes,
                         frozenset() if on else FIRST_INPUT_FORWARDING_OPS,
                         # both only change what the allocator replay sees
                         onednn_workspaces(index, batch_size) if on and allocator
                         else Workspaces(),
                         constant_initialized(index, nodes) if allocator else frozenset())
    if order is not None or schedule != "executor":
        est = run_in(order if order is not None else index.topo)
        est.walk = WALK_GIVEN if order is not None else WALK_TOPOLOGICAL
        return _with_orders(est, [])
    # a training run goes through TF's warm-up orders, then its steady one (schedule.py):
    # its peak is the highest. On two cores forked children simulate the others
    # (the executor's orders hold only `nodes`: no need to filter them again)
    (_, first_walk, first_order), *others = executor_walks(index, nodes, batch_size,
                                                           bypassed)
    # (phase, walk, order, start and end times: two threads running ops side by side)
    orders = [(phase, walk, order, None) for phase, walk, order in others]
    two = two_thread_order(index, nodes, batch_size, bypassed) \
        if two_threads and allocator else None
    if two is not None:
        orders.append(("warm-up", WALK_TWO_THREADS, two.order, (two.start_at, two.end_at)))
    aside = [(phase, walk, order, timing,
              Background(partial(run_in, order, True, timing), len(index)))
             for phase, walk, order, timing in orders]
    best = run_in(first_order, True)
    best.walk = first_walk
    walked = [OrderPeak(best.phase, best.peak_bytes, best.peak_op, walk=first_walk)]
    highest, threads = best.highest_bytes, 1
    for phase, walk, order, timing, job in aside:
        est = job.result() or run_in(order, True, timing)
        n = 1 if timing is None else 2
        walked.append(OrderPeak(phase, est.peak_bytes, est.peak_op, n, walk))
        if est.estimated_bytes > highest:
            highest, threads = est.estimated_bytes, n
        # two threads: a bound on the peak only (plans are ranked on one thread's
        # orders, which measured rewrites follow at one thread)
        if est.peak_bytes > best.peak_bytes and n == 1:
            est.phase, est.walk, best = phase, walk, est
    best.highest_bytes, best.highest_threads = highest, threads
    best.step_times = two.times if two is not None else None
    return _with_orders(best, walked)


def _with_orders(est: MemoryEstimate, walked: list[OrderPeak]) -> MemoryEstimate:
    """The estimate with the orders walked to reach it (itself alone when none)."""
    est.orders = walked or [OrderPeak(est.phase, est.peak_bytes, est.peak_op, walk=est.walk)]
    return est


@dataclass
class _Simulation:
    """What one simulation needs besides the order: computed once, shared by the
    simulations of both orders."""

    index: GraphIndex
    batch_size: int | None
    host: str | None
    keep_timeline: bool
    top: int
    loops: LoopFacts
    scratch: object
    allocator: bool
    forwards: set[int]
    variables: list[tuple[int, int]]
    nodes: set[int] | None
    first_input_forwarding: frozenset[str] = FIRST_INPUT_FORWARDING_OPS
    workspaces: Workspaces = field(default_factory=Workspaces)
    initial_copies: frozenset[int] = frozenset()  # variables.constant_initialized

    def __call__(self, order: list[int], of_nodes: bool = False,
                 timing: tuple[list[float], list[float]] | None = None) -> MemoryEstimate:
        """The estimate in `order`, less ops not in `nodes` (unless `of_nodes`: it has
        none). `timing`: each position's start and end time, when ops run side by side
        (two threads): an op's buffers are freed when it ends, not before the next op."""
        index, loops, variables = self.index, self.loops, self.variables
        if self.nodes is not None and not of_nodes:
            order = [i for i in order if i in self.nodes]
        devices = index.devices
        normal = {d: normalize_device(d) for d in {devices[i] for i, _ in variables}}
        run = _simulate(index, order, self.batch_size, self.host, self.keep_timeline,
                        track_lives=bool(self.top), loops=loops, scratch=self.scratch,
                        allocator=self.allocator, forwards=self.forwards,
                        persistent=[(normal[devices[i]], b) for i, b in variables],
                        variable_keys={i: (k, b) for k, (i, b) in enumerate(variables)},
                        first_input_forwarding=self.first_input_forwarding,
                        workspaces=self.workspaces, initial_copies=self.initial_copies,
                        timing=timing)
        live_at_peak: list[LiveTensor] = []
        if self.top and order:  # the buffers whose lifetime spans the peak
            at_peak = [(-b, born, buf) for buf, b, born, freed in run.lifetimes
                       if born <= run.peak_pos <= freed]
            at_peak.sort()  # largest first, then in the order they were allocated
            live_at_peak = [_live_tensor(index, loops, buf, -b, self.batch_size)
                            for b, _, buf in at_peak[:self.top]]
        return MemoryEstimate(run.peak, sum(b for _, b in variables), run.peak_pos,
                              index.names[order[run.peak_pos]] if order else "",
                              live_at_peak, run.peak_dev, run.timeline, run.unknown,
                              run.host_peak, len(order), loops.loops, loops.notes,
                              highest_bytes=run.highest,
                              order=list(order) if self.keep_timeline else [])


def _live_tensor(index: GraphIndex, loops: LoopFacts, buf: Tensor, b: int,
                 batch_size: int | None) -> LiveTensor:
    if buf[1] == _STACK:  # the earlier elements of a v1 stack, named after its push
        steps = loops.push_steps.get(buf[0], 1)
        ins = index.data_inputs[buf[0]]
        elem = index.shape(ins[1]) if len(ins) > 1 else None
        return LiveTensor(f"{index.names[buf[0]]} ({steps - 1} earlier steps)", b,
                          [steps - 1, *elem] if elem is not None else None)
    if buf[1] == _WORKSPACE:
        return LiveTensor(f"{index.names[buf[0]]} (oneDNN workspace)", b, None)
    if buf[1] <= _COW:  # the old buffer of a variable an update had to copy
        ins = index.data_inputs[buf[0]]
        j = _COW - buf[1]
        var = index.names[ins[j][0]] if j < len(ins) else "?"
        return LiveTensor(f"{var} (kept by a read while {index.names[buf[0]]} writes a copy)",
                          b, None)
    # a leading dimension that is not the batch size shown resolved (`[25088, 384]`, not
    # `[?, 384]` beside 37 MiB)
    return LiveTensor(index.tensor_name(buf), b, index.shape_at(buf, batch_size))


_STACK = -1  # output index of the virtual buffer that holds a v1 stack's earlier elements
_WORKSPACE = UNRANKED  # output index of a oneDNN workspace (onednn_workspaces.py)
_FIRST_COPY = -(1 << 31)  # - j: the first step's copy of the variable at input j (bfc.py)
_COW = -2  # output index -2 - j: the old buffer of the variable at input j of an update


@dataclass
class _Run:
    peak: int = 0
    peak_pos: int = 0
    host_peak: int = 0
    unknown: int = 0
    peak_dev: dict[str, int] = field(default_factory=dict)
    timeline: list[int] = field(default_factory=list)
    highest: int = 0  # the highest replayed step (bfc.StepPeaks.highest)
    # (buffer, bytes, position allocated, position freed) of device buffers; a buffer is
    # live while the op at its freeing position runs, and to the end if never freed
    lifetimes: list[tuple[Tensor, int, int, int]] = field(default_factory=list)


@dataclass
class _Buffers:
    """The buffers of the step as the walk knows them. Several tensors may share one
    buffer (aliases, forwarded inputs, a pop handing back what was pushed); a buffer is
    freed when no read of it is pending."""

    buffer_of: dict[Tensor, Tensor] = field(default_factory=dict)  # tensor -> its buffer
    size: dict[Tensor, int] = field(default_factory=dict)  # live buffer -> bytes
    pending: dict[Tensor, int] = field(default_factory=dict)  # reads still to come, per buffer
    born: dict[Tensor, int] = field(default_factory=dict)  # buffer -> position allocated
    track_lives: bool = False  # `born` is kept (the live set at the peak is wanted)


@dataclass
class _Usage:
    """Where allocations are counted: the requests replayed through the allocator model
    (`events`, bfc.py), or their sums per device; the host's peak apart."""

    run: _Run
    host: str | None
    events: list[tuple] | None
    live_dev: dict[str, int] = field(default_factory=dict)

    def add(self, dev: str, b: int) -> int:
        """Count b bytes on `dev`; returns what it adds to the device being estimated."""
        self.live_dev[dev] = self.live_dev.get(dev, 0) + b
        if dev == self.host:
            self.run.host_peak = max(self.run.host_peak, self.live_dev[dev])
            return 0
        return b


@dataclass
class _Stacks:
    """v1 loop accumulators (and lowered v2 tensor lists): what each push holds until
    its pop, and the buffers released at a later position (a gradient loop's end)."""

    held: dict[Tensor, Tensor] = field(default_factory=dict)  # pushed tensor -> its buffer
    held_buffers: set[Tensor] = field(default_factory=set)
    releases: dict[int, list[Tensor]] = field(default_factory=dict)  # position -> buffers


@dataclass
class _VariableReads:
    """Reads of resource variables, for copy-on-write: an update while a read is still
    to be consumed gives the variable a new buffer and keeps the old one."""

    reads_of: dict[Tensor, list[Tensor]] = field(default_factory=dict)  # handle -> reads
    held_by: dict[Tensor, list[Tensor]] = field(default_factory=dict)  # read -> old buffers


_NOTHING_TAKEN: frozenset = frozenset()


class _OpKind:
    """What the simulation asks of an op type, answered once per type: a 100k-op step
    repeats a few dozen types, and each question is a set lookup per output otherwise."""

    __slots__ = ("updates", "back_edge", "aliasing", "persistent", "element_view",
                 "forwarding", "first_only", "scratch")

    def __init__(self, op: str, first_input_forwarding: frozenset[str]) -> None:
        self.updates = updates_variable(op)
        self.back_edge = op in _BACK_EDGES
        self.aliasing = op in ALIASING_OPS
        self.persistent = op in PERSISTENT_OPS
        self.element_view = op in ELEMENT_VIEW_OUTPUT
        self.first_only = op in first_input_forwarding  # forwards its first input alone
        self.forwarding = op in FORWARDING_OPS or self.first_only
        self.scratch = has_scratch(op)  # kernel_scratch.scratch_model is 0 for the others


def _simulate(index: GraphIndex, order: list[int], batch_size: int | None, host: str | None,
              keep_timeline: bool, track_lives: bool = False,
              loops: LoopFacts | None = None, scratch=None,
              allocator: bool = True, persistent: list[tuple[str, int]] | None = None,
              forwards: set[int] | None = None,
              variable_keys: dict[int, tuple[int, int]] | None = None,
              timing: tuple[list[float], list[float]] | None = None,
              first_input_forwarding: frozenset[str] = FIRST_INPUT_FORWARDING_OPS,
              workspaces: Workspaces | None = None,
              initial_copies: frozenset[int] = frozenset()) -> _Run:
    """One pass over `order` with reference-counted buffers. Linear in the graph: rather
    than listing the live set at every new peak, it records each buffer's lifetime
    (`track_lives`), from which the live set at the final peak is read afterwards.

    Loops (see loops.py): a value a v1 loop pushes (on a stack, or on a tensor list in a
    lowered v2 loop) stays alive from its producer until its pop (the pop's output is that
    buffer), and the accumulator's earlier elements are allocated with it and freed after
    the gradient loop's last op; a NextIteration's value lives to its loop's end; v2 list
    outputs take their sizes from `loops.output_bytes`, list element reads allocate
    nothing, and a While op holds its body's peak while it runs. Ops in `forwards` (a
    reduction over nothing, broadcast_grads.py) hand on their first input's buffer.

    An `AssignVariableOp` that reads its value last makes the variable take the value's
    buffer (TF moves a uniquely held tensor into the variable): the value's chunk stays
    with the variable and the variable's old chunk is freed (`variable_keys`: variable
    op -> its place in `persistent` and its bytes). Keras' optimizers write their slots so,
    every step: the allocator's chunks move from step to step (bfc.py replays several).
    An update that has to copy its variable (a read of it is still to be consumed:
    copy-on-write) moves it too: the copy, allocated by the update, stays with the
    variable, and the variable's old chunk is freed with the last of those reads (Keras'
    `AssignAddVariableOp` on each weight, while the step still holds a read of it).

    `timing` (start and end time of each position, two threads): the allocator's events
    are put in time order, each op's frees at its end (`_in_time`).

    `workspaces` (onednn_workspaces.py): buffers oneDNN's forward kernels allocate beside
    their outputs for their gradients alone, freed after the last of those gradients.
    They count in the highest estimate, not yet in the one that ranks plans (bfc.py,
    UNRANKED): ranked with them, six of the nine TF1 networks' memory plans change, and
    those measured no lower on the whole (docs/findings.md, "Plans ranked with oneDNN's
    workspaces, or picked by the step a session repeats: not kept").

    `initial_copies`: variables that share a constant's buffer when a TF1 session starts
    (variables.constant_initialized). The first in-place update of each writes a copy,
    which the variable keeps, while the constant keeps the old chunk: the first step
    leaves those copies among the chunks it frees, and every later step's chunks differ
    (measured on tf-slim ResNet-50 v2: the momentum slots, 91 MiB, took 90 MiB more chunk
    rounding from the second step on). A replay event of the first step alone (bfc.py);
    what the later steps reach counts in the highest estimate, not in the ranking one."""
    run = _Run()
    # what the allocator is asked, in order, replayed through a model of TF's allocator
    # at the end (bfc.py, replay_step), which then counts every peak: the sums of
    # requests (`live`, `live_dev`) are kept only without it
    events: list[tuple] | None = [] if allocator else None
    loops = loops if loops is not None and not loops.is_empty() else None
    push_steps = loops.push_steps if loops else {}
    pushed = loops.pushed if loops else {}
    pop_source = loops.pop_source if loops else {}
    list_bytes = loops.output_bytes if loops else {}
    body_peak = loops.body_peak if loops else {}
    run_ahead = loops.run_ahead if loops else {}
    frame_end = _frame_ends(order, index.frame)
    release_at = loops.release_positions(frame_end) if loops else {}
    stacks = _Stacks()
    releases = stacks.releases  # position -> buffers read for the last time
    held = stacks.held
    end = len(order)
    member = bytearray(len(index))
    for i in order:
        member[i] = 1
    partial_inputs, read_outside = _outside_edges(index, member)
    normal = {d: normalize_device(d) for d in set(index.devices)}
    device_of = list(map(normal.__getitem__, index.devices))
    bufs = _Buffers(track_lives=track_lives)
    # the walk's own names for the structures' parts (the loop below is the hot path)
    born, pending, size, buffer_of = bufs.born, bufs.pending, bufs.size, bufs.buffer_of
    usage = _Usage(run, host, events)
    live_dev = usage.live_dev
    live = 0
    ops, data_inputs, consumers, frame = index.ops, index.data_inputs, index.consumers, \
        index.frame
    num_outputs, data_consumers = index.num_outputs, index.data_consumers
    sizes_of = index.output_bytes(batch_size)
    sizes = index.output_sizes(batch_size)  # the same lists, without a call per op
    variable_reads = _VariableReads()
    reads_of, held_by = variable_reads.reads_of, variable_reads.held_by
    # copy-on-write buffers -> their variable's place in `persistent`: at their free the
    # variable keeps the copy and its old chunk is freed (the replay's adopt event)
    moved_at_free: dict[Tensor, int] = {}
    # per op type, asked once per op rather than once per output (see _OpKind)
    kinds: dict[str, _OpKind] = {}
    ref_outputs = _ref_outputs(index)
    lifetimes = run.lifetimes
    ws_bytes = workspaces.bytes_of if workspaces else None
    ws_read_by = workspaces.read_by if workspaces else {}
    ws_reads = workspaces.reads if workspaces else None
    copied_once: set[int] = set()  # initial_copies already updated in this step
    peak = peak_pos = unknown = 0
    peak_dev = run.peak_dev
    blocks: list[int] = []  # with timing: where each op's events begin
    for p, i in enumerate(order):
        if timing is not None:
            blocks.append(len(events))
        op = ops[i]
        dev = device_of[i]
        inputs = data_inputs[i]
        if partial_inputs[i]:
            inputs = [t for t in inputs if member[t[0]]]
        kind = kinds.get(op)
        if kind is None:
            kind = kinds[op] = _OpKind(op, first_input_forwarding)
        adopted = None
        if op == "AssignVariableOp" and variable_keys and len(inputs) == 2 and \
                events is not None:
            adopted = _adopted_value(inputs, buffer_of, pending, size, variable_keys)
            if adopted is not None:  # the variable swaps buffers: nothing is copied
                reads_of.pop(inputs[0], None)
        if op == "ReadVariableOp" and inputs:
            reads_of.setdefault(inputs[0], []).append((i, 0))
        elif reads_of and kind.updates and adopted is None:
            for j, h in enumerate(inputs):
                if h not in reads_of:
                    continue
                b = _copy_on_write(i, j, h, inputs, variable_reads, bufs, sizes_of)
                if b:
                    if events is not None:
                        events.append(((i, _COW - j), dev, b, p))
                        key = variable_keys.get(h[0]) if variable_keys else None
                        if key is not None and allocation_bytes(key[1]) == \
                                allocation_bytes(b):
                            moved_at_free[(i, _COW - j)] = key[0]
                    if track_lives and dev != host:
                        born[(i, _COW - j)] = p
                    live += usage.add(dev, b)
        if initial_copies and kind.updates and op != "AssignVariableOp" and \
                events is not None and variable_keys:
            for j, h in enumerate(inputs):
                v = h[0]
                if v in initial_copies and v not in copied_once and v in variable_keys:
                    copied_once.add(v)
                    k, b = variable_keys[v]
                    events.append(((i, _FIRST_COPY - j), device_of[v], allocation_bytes(b),
                                   p, k))
        taken = _NOTHING_TAKEN  # input buffers this op's outputs took over (a set once any)
        out_sizes = refs = None
        persistent_out = kind.persistent or (op == "Identity" and _reads_variable(index, i))
        popping = i in pop_source
        # buffers whose pending reads this op changed (its outputs', its inputs'): the
        # ones none is left of are freed after it. Repeats are harmless (a freed buffer
        # has no size any more), so a list, not a set
        touched = []
        n_out = num_outputs[i]
        for k in range(n_out):
            t = (i, k)
            # its readers (one per input slot), from the node's own list when it has one
            # output: faster than the dictionary by tensor
            readers_of = data_consumers(i) if n_out == 1 else consumers.get(t, ())
            if read_outside[i]:
                readers = 0
                for c in readers_of:
                    readers += member[c]
            else:
                readers = len(readers_of)
            if kind.back_edge:
                # the next iteration reads it; in the one run of the body, that is the
                # loop's end (its Merge ran already)
                readers = 1
                releases.setdefault(max(frame_end.get(index.frame[i], p), p), []).append(t)
            if popping and k == _POP_OUTPUT.get(op, 0) and pop_source[i] in held:
                buf = held.pop(pop_source[i])  # the pop hands back the pushed buffer
                buffer_of[t] = buf
                pending[buf] = pending.get(buf, 0) + readers - 1
                touched.append(buf)
                continue
            if kind.aliasing:
                src = _aliased_input(op, k, inputs)
            elif k == 0 and forwards and i in forwards and inputs:
                src = inputs[0]  # a reduction over nothing (broadcast_grads.py)
            else:
                src = None
            # (an identity across devices is a copy: it allocates)
            if src is not None and device_of[src[0]] == dev and src in buffer_of:
                buf = buffer_of[src]
                buffer_of[t] = buf
                pending[buf] = pending.get(buf, 0) + readers
                touched.append(buf)
                continue
            if list_bytes and t in list_bytes:
                b = list_bytes[t]
            else:
                if out_sizes is None:
                    out_sizes = sizes[i]
                b = out_sizes[k]
            if b is None and frame[i] and k == 0:
                b = _loop_body_size(op, inputs, buffer_of, size)
            if b is None:
                unknown += 1
                b = 0
            elif b:
                if refs is None:
                    refs = ref_outputs(i)
                if persistent_out or (kind.element_view and element_view(op, k)) or \
                        k in refs:
                    b = 0
                else:
                    b = allocation_bytes(b)  # TF's BFC allocator hands out multiples of 256
                    if kind.forwarding:
                        donor = _forwardable(op, inputs, buffer_of, pending, size, b, taken,
                                             kind.first_only)
                        if donor is not None:  # TF reuses an input buffer this op reads last
                            if taken is _NOTHING_TAKEN:
                                taken = set()
                            taken.add(donor)
                            buffer_of[t] = donor
                            pending[donor] = pending.get(donor, 0) + readers
                            touched.append(donor)
                            continue
            buffer_of[t] = t
            size[t] = b
            pending[t] = readers
            touched.append(t)
            if b:
                if track_lives and dev != host:
                    born[t] = p
                if events is not None:
                    events.append((t, dev, b, p))
                else:
                    live_dev[dev] = live_dev.get(dev, 0) + b
                    if dev == host:
                        run.host_peak = max(run.host_peak, live_dev[dev])
                    else:
                        live += b
        if ws_bytes and i in ws_bytes and events is not None:  # (counted in replays only)
            readers = sum(member[r] for r in ws_read_by[i])
            if readers:
                t = (i, _WORKSPACE)
                b = allocation_bytes(ws_bytes[i])
                size[t] = b
                pending[t] = readers
                if track_lives and dev != host:
                    born[t] = p
                events.append((t, dev, b, p))
        if pushed:
            for k in range(num_outputs[i]):
                push = pushed.get((i, k))
                if push is not None and member[push]:
                    # an element read from a list is a reference into it: the list may go,
                    # the accumulator keeps the element
                    ref = (sizes_of(i)[k] or 0) if element_view(op, k) else 0
                    live += _hold_stack(push, (i, k), ref, push_steps[push],
                                        max(release_at.get(push, end), p), p, device_of[push],
                                        stacks, bufs, usage)
        extra = body_peak.get(i, 0) if body_peak else 0  # a While's body, one iteration
        if scratch is not None and kind.scratch:
            extra += scratch(i)  # the kernel's own buffers while it runs
        # the terms of iterations run ahead of a running sum (loops.py), each its own
        # request, while the While runs
        ahead = run_ahead.get(i, ()) if run_ahead else ()
        if events is not None:  # the allocator model's replay counts the peaks
            if extra:
                events.append((("x", i), dev, extra, p))
            for n, b in enumerate(ahead):
                events.append((("ahead", i, n), dev, b, p))
            if keep_timeline:
                events.append((p,))
            if extra:
                events.append((("x", i), None))
            for n in range(len(ahead)):
                events.append((("ahead", i, n), None))
        else:  # the peaks are sums of requests
            extra += sum(ahead)
            if extra:
                live += extra
                live_dev[dev] = live_dev.get(dev, 0) + extra
            if keep_timeline:
                run.timeline.append(live)
            if live > peak:
                peak, peak_pos = live, p
            here = live_dev.get(dev, 0)
            if here > peak_dev.get(dev, 0):
                peak_dev[dev] = here
            if extra:
                live -= extra
                live_dev[dev] -= extra
        for t in inputs:  # one read per input slot
            buf = buffer_of.get(t)
            if buf is not None:
                pending[buf] = pending.get(buf, 0) - 1
                touched.append(buf)
        if ws_reads and i in ws_reads:
            for f in ws_reads[i]:
                buf = (f, _WORKSPACE)
                if buf in size:
                    pending[buf] -= 1
                    touched.append(buf)
        if adopted is not None:  # before its free, which the replay then leaves alone
            events.append(adopted)
        if releases:
            for t in releases.pop(p, ()):
                buf = buffer_of.get(t, t)
                pending[buf] = pending.get(buf, 0) - 1
                touched.append(buf)
        if held_by:  # old variable buffers go with the last read that kept them
            for buf in touched[:]:
                if pending.get(buf, 0) <= 0 and buf in size:
                    for old in held_by.pop(buf, ()):
                        pending[old] -= 1
                        touched.append(old)
        for buf in touched:
            if pending.get(buf, 0) <= 0 and buf in size:
                b = size.pop(buf)
                pending.pop(buf, None)
                if born:
                    since = born.pop(buf, None)
                    if since is not None:
                        lifetimes.append((buf, b, since, p))
                if b:
                    if events is not None:
                        if moved_at_free and buf in moved_at_free:  # before its free
                            events.append((buf, moved_at_free.pop(buf), ADOPT))
                        events.append((buf, None))
                    else:
                        d = device_of[buf[0]]
                        live_dev[d] -= b
                        if d != host:
                            live -= b
    run.peak, run.peak_pos, run.unknown = peak, peak_pos, unknown
    run.lifetimes.extend((buf, size[buf], p, end) for buf, p in born.items())
    if timing is not None and events is not None:
        events = _in_time(events, blocks, *timing)
    if events is not None:  # the peaks TF's allocator statistics count (bfc.py)
        peaks = replay_step(events, persistent or [], host, keep_timeline)
        run.peak, run.peak_pos, run.peak_dev, run.host_peak, run.highest = \
            peaks.peak, peaks.peak_pos, peaks.peak_dev, peaks.host_peak, peaks.highest
        if keep_timeline:
            run.timeline = peaks.timeline
    return run


def _in_time(events: list[tuple], blocks: list[int], start_at: list[float],
             end_at: list[float]) -> list[tuple]:
    """The allocator's events of ops running side by side, in time order: each op's
    requests when it starts (its position's), its frees (and a variable's adoption of a
    buffer) when it ends, after the requests of every op that started before. An op that
    takes no time frees at once."""
    out: list[tuple] = []
    ending: list[tuple[float, int, list[tuple]]] = []  # (end, position, its frees)
    bounds = blocks + [len(events)]
    for p, begin in enumerate(blocks):
        start = start_at[p]
        while ending and ending[0][0] <= start:
            out.extend(heapq.heappop(ending)[2])
        frees: list[tuple] = []
        for ev in events[begin:bounds[p + 1]]:
            (out if len(ev) in (1, 4, 5) else frees).append(ev)
        if frees:
            if end_at[p] <= start:
                out.extend(frees)
            else:
                heapq.heappush(ending, (end_at[p], p, frees))
    while ending:
        out.extend(heapq.heappop(ending)[2])
    return out


def _adopted_value(inputs: list[Tensor], buffer_of: dict, pending: dict, size: dict,
                   variable_keys: dict[int, tuple[int, int]]) -> tuple | None:
    """The replay's event (buffer, variable's place, "adopt") when AssignVariableOp's value
    buffer, made in the step, is read last by it and is the variable's size (so TF moves
    it into the variable); else None."""
    key = variable_keys.get(inputs[0][0])
    buf = buffer_of.get(inputs[1])
    if key is None or buf is None or not size.get(buf) or pending.get(buf, 0) != 1:
        return None
    k, b = key
    return (buf, k, ADOPT) if size[buf] == allocation_bytes(b) else None


def _copy_on_write(i: int, j: int, handle: Tensor, inputs: list[Tensor],
                   variable_reads: _VariableReads, bufs: _Buffers, sizes_of) -> int:
    """Update op i writes the variable at its input j (`handle`). If reads of it taken
    since its last copy are still to be consumed by other ops, the variable gets a new
    buffer and the old one (the reads' buffer) is registered as a buffer of its own, freed
    with the last of those reads. Returns its bytes (0: written in place)."""
    buffer_of, pending, size = bufs.buffer_of, bufs.pending, bufs.size
    held_by = variable_reads.held_by
    reads = variable_reads.reads_of.pop(handle)
    alive = []
    for r in reads:
        buf = buffer_of.get(r)
        if buf is None or buf not in size:
            continue
        here = sum(1 for u in inputs if buffer_of.get(u) == buf)
        if pending.get(buf, 0) - here > 0:
            alive.append(buf)
    if not alive:
        return 0
    b = next((sizes_of(r[0])[0] for r in reads if sizes_of(r[0])[0]), None)
    if not b:
        return 0
    old = (i, _COW - j)
    size[old] = b
    buffer_of[old] = old
    pending[old] = len(set(alive))
    for buf in set(alive):
        held_by.setdefault(buf, []).append(old)
    return b


def _hold_stack(push: int, element: Tensor, ref_bytes: int, steps: int, release: int, p: int,
                dev: str, stacks: _Stacks, bufs: _Buffers, usage: _Usage) -> int:
    """A value a v1 loop will push (StackPushV2, TensorListPushBack), just computed: it
    stays alive until its pop, and the accumulator's earlier `steps - 1` elements of the same size (each its own allocation,
    rounded up as TF's BFC allocator does) are allocated now and freed after position
    `release` (the gradient loop's last op). A buffer pushed by several stacks is held and
    counted once. `ref_bytes`: the size of an element the simulation counts nowhere (a
    reference into a tensor list), all `steps` of which the accumulator then holds.
    Returns the bytes added to the device being estimated."""
    buffer_of, pending, size = bufs.buffer_of, bufs.pending, bufs.size
    buf = buffer_of.get(element)
    if buf is None or buf not in size or buf in stacks.held_buffers:
        return 0
    stacks.held[element] = buf
    stacks.held_buffers.add(buf)
    pending[buf] = pending.get(buf, 0) + 1  # read again by the pop
    if size[buf]:
        b = allocation_bytes(size[buf]) * max(steps - 1, 0)
    else:
        b = allocation_bytes(ref_bytes) * steps
    if not b:
        return 0
    acc = (push, _STACK)
    size[acc] = b
    buffer_of[acc] = acc
    pending[acc] = 1  # read once more, by the end of the gradient loop
    stacks.releases.setdefault(release, []).append(acc)
    if usage.events is not None:
        usage.events.append((acc, dev, b, p))
    if not usage.add(dev, b):
        return 0
    if bufs.track_lives:
        bufs.born[acc] = p
    return b


def _loop_body_size(op: str, inputs: list[Tensor], buffer_of, size) -> int | None:
    """The size of an output inside a v1 loop whose shape TF's inference left unknown (a
    Merge waits for its back edge, and what follows inherits the gap): a Merge carries
    its entry value's size, an element-wise op its largest input's."""
    if op in ("Merge", "RefMerge"):
        known = inputs[:1]
    elif op in FORWARDING_OPS:
        known = inputs
    else:
        return None
    sizes = [size.get(buffer_of.get(t)) for t in known]
    sizes = [b for b in sizes if b]
    return max(sizes) if sizes else None


def _outside_edges(index: GraphIndex, member: bytearray) -> tuple[bytearray, bytearray]:
    """Per node, whether it reads an output of an op outside the simulation (`member`
    0), whose inputs it then skips, and whether such an op reads one of its outputs, which
    it then does not count among the readers. Only the ops outside are walked: most ops
    are spared both filters."""
    n = len(index)
    partial_inputs, read_outside = bytearray(n), bytearray(n)
    data_inputs, data_consumers = index.data_inputs, index.data_consumers
    for s in compress(range(n), member.translate(_FLIP)):
        for c in data_consumers(s):
            partial_inputs[c] = 1
        for src, _ in data_inputs[s]:
            read_outside[src] = 1
    return partial_inputs, read_outside


_FLIP = bytes.maketrans(b"\0\1", b"\1\0")


def _frame_ends(order: list[int], frame: list[str]) -> dict[str, int]:
    """The position of the last op of each v1 loop frame (none for graphs without)."""
    last: dict[str, int] = {}
    if not any(frame):  # at C speed: most graphs have no v1 loops
        return last
    for p, i in enumerate(order):
        f = frame[i]
        if f:
            last[f] = p
    return last


def _ref_outputs(index: GraphIndex):
    """A function node id -> the indices of its reference outputs (`Assign`,
    `ApplyMomentum` on a TF1 variable): each is the variable's own buffer, nothing is
    allocated for it. Asked per dtype list, which nodes of one signature share."""
    out_dtypes = index.out_dtypes
    found: dict[int, tuple] = {}  # id of a dtype list -> its reference outputs
    keep = []  # the lists asked about, so that their ids stay theirs

    def ref_outputs(i: int) -> tuple[int, ...]:
        types = out_dtypes[i]
        refs = found.get(id(types))
        if refs is None:
            keep.append(types)
            refs = found[id(types)] = tuple(k for k, d in enumerate(types or ())
                                            if d is not None and dtypes.is_ref(d))
        return refs

    return ref_outputs


def _aliased_input(op: str, k: int, inputs: list[Tensor]) -> Tensor | None:
    if op not in ALIASING_OPS or not inputs:
        return None
    if op == "IdentityN":
        return inputs[k] if k < len(inputs) else None
    if op == "StackPushV2":  # outputs the element it pushed
        return inputs[1] if k == 0 and len(inputs) > 1 else None
    if op in ("Switch", "RefSwitch"):  # both branches forward the data input
        return inputs[0] if k < 2 else None
    return inputs[0] if k == 0 else None


def _forwardable(op, inputs, buffer_of, pending, size, nbytes_out, taken,
                 first_only: bool = False) -> Tensor | None:
    """An input buffer of the same size read for the last time here, which TF's element-wise
    kernels take over as their output instead of allocating (`first_only`: a kernel that
    forwards its first input alone)."""
    if first_only:
        inputs = inputs[:1]
    elif op not in FORWARDING_OPS:
        return None
    slots = len(inputs)
    for t in inputs:
        buf = buffer_of.get(t)
        if buf is None or buf in taken or size.get(buf) != nbytes_out:
            continue
        left = pending.get(buf, 0)
        # more reads left than this op has slots: read later too (no need to count)
        if left <= slots and left == sum(1 for u in inputs if buffer_of.get(u) == buf):
            return buf
    return None


def _reads_variable(index: GraphIndex, i: int) -> bool:
    ins = index.data_inputs[i]
    return bool(ins) and index.ops[ins[0][0]] in VARIABLE_OPS
