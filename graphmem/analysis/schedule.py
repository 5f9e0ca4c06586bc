"""The order in which TensorFlow's executor runs a step's ops, approximately.

With one inter-op thread, TF's executor runs inexpensive ready ops inline, first in first
out; of the expensive ops made ready by one op, it keeps the last (its last out-edge: the
consumer latest in the GraphDef) to run next and dispatches the others as tasks, which the
single pool thread takes last in, first out. The last one runs next only when no
inexpensive op is queued inline. The effect is a depth-first walk: a backward chain runs to
its end while the ops it readied on the way (weight gradient updates, side branches) wait.
Memory depends on that order, so the estimator follows it instead of a breadth-first
topological order.

Grappler rewrites the graph before the step: ops it removes take no turn here. They
complete with the op that readies them, and what they ready counts as readied by that op:
the NoOps and Identity ops tf.gradients puts after each gradient (`tuple/group_deps`,
`tuple/control_dependency`), and the reductions and reshapes of a broadcast gradient that
reduce nothing (`bypassed`, analysis/broadcast_grads.py). A recompute segment held back by
a gradient's `tuple/control_dependency` therefore runs right after the gradient op itself
(appended last to the GraphDef, it is that op's last out-edge; traced on a ResNet budget
plan, where the segment was recomputed before the block's batch-norm gradient).

Every kernel starts out expensive: TF's cost estimate of an op starts at 1e8 cycles and
decays by a tenth per run, so only kernels that declare themselves inexpensive (Identity,
Shape, Const, ...) run inline in a training run's first ~90 steps (`warm_up=True`); in the
steady state after them, ops producing at most 4 KiB are taken as inexpensive too, as TF
learns. The two orders can peak differently (a small op dispatched as a task lets the
chain that readied it run on, holding what the task would have freed), and a training run
goes through both: the estimator simulates each (memory.py).

A TF2 train step is a function body (its inputs are `_Arg` ops). TF runs it inlined into
the caller's graph, where every op without inputs waits on one input control node (a call
starts when all its inputs are ready); that node is inexpensive, so all those ops become
ready at once and run inline first in first out, and every expensive op they ready on the
way is dispatched. The order starts such graphs that way: the body's sources (arguments,
variable handles, constants) all run first, not one per drained task queue as the separate
roots of a TF1 graph do (traced: a TF2 SGD-with-momentum step runs `momentum * velocity`
for every variable before the forward pass; one root at a time, it ran after the backward
pass and held every gradient until then).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from itertools import compress

from graphmem.graph.index import GraphIndex
from graphmem.native import native

# Kernels TF marks inexpensive, or that only forward or describe a buffer.
CHEAP_OPS = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size", "Rank",
    "Reshape", "ExpandDims", "Squeeze", "StopGradient", "Snapshot", "PreventGradient",
    "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "VarHandleOp", "VariableV2",
    "ReadVariableOp", "ControlTrigger", "Enter", "Exit", "Merge", "Switch", "NextIteration",
    "LoopCond", "RefIdentity", "ZerosLike", "OnesLike", "Fill", "BroadcastGradientArgs",
    "DynamicStitch", "Pack", "StridedSlice", "ConcatOffset", "InvertPermutation", "Range",
})
# Steps with more ops are walked in GraphDef order only (executor_walks).
REVERSE_WALK_OPS = 50_000
# Ops this small are taken as inexpensive (TF learns so after ~90 runs of each).
_SMALL_BYTES = 4096


# How each order the simulation walks takes TF's ready ops (OrderPeak.walk, the reports'
# words for it): the steady state's, and the warm-up's with its dispatched ops taken
# last in, first out (TF1 steps, and a TF2 step's pool thread), the same with ops readied
# together through control edges taken in reverse, and first in, first out (a TF2 step's
# caller thread); two_thread_order's is two threads running ops side by side
WALK_STEADY = "steady state"
WALK_LIFO = "dispatched ops last in, first out"
WALK_REVERSED = "dispatched ops last in, first out, control edges reversed"
WALK_FIFO = "dispatched ops first in, first out"
WALK_TWO_THREADS = "two threads side by side"
WALK_TOPOLOGICAL = "topological order"  # estimate_memory(schedule="topo")
WALK_GIVEN = "the order given"  # estimate_memory(order=...)


def executor_walks(index: GraphIndex, nodes: set[int] | None = None,
                   batch_size: int | None = None,
                   bypassed: set[int] | None = None) -> list[tuple[str, str, list[int]]]:
    """The distinct orders a training run goes through, each with its phase and walk
    (WALK_*, how it takes the ready ops): the steady
    state's, and the warm-up's. In a TF2 step the warm-up's dispatched ops are taken both
    ways: the caller's thread runs the step's start and queues the expensive ops it
    readies behind each other (first in, first out), while the pool thread, once it runs
    them, takes what it queues itself last in, first out; which thread readies an op
    changes from step to step and process to process, and so does the peak (a Keras step
    measured 122, 136 and 145 KiB in three processes). A TF1 step runs on the pool thread
    after its first op: last in, first out.

    The warm-up is also walked with the ops readied together through control edges taken
    in the reverse order (`reverse`; tf.gradients' groups become control edges in
    Grappler's graph): TF's out-edge order is the GraphDef order of the graph Grappler hands the
    executor, which graphmem cannot see (Grappler sorts it again, constant folding appends
    nodes), and of two expensive ops readied together it runs one at once and queues the
    other. Traced on tf-slim's AlexNet: TF ran a fully connected layer's input gradient
    before its weight gradient, the reverse of the graph's order, so each weight gradient
    (and its decay term) waited, queued, to the end of the backward pass. Each order costs
    a simulation of the step, so the reverse walks are taken for steps of at most
    REVERSE_WALK_OPS ops (real networks' steps; synthetic 100k-op chains keep the time
    they had)."""
    step = _StepGraph(index, nodes, batch_size, bypassed)
    found = [("steady", WALK_STEADY, step.walk(warm_up=False))]
    candidates = [("warm-up", WALK_LIFO, step.walk(warm_up=True))]
    if len(found[0][2]) <= REVERSE_WALK_OPS:
        candidates.append(("warm-up", WALK_REVERSED, step.walk(warm_up=True, reverse=True)))
    if step.function_body:
        candidates.append(("warm-up", WALK_FIFO, step.walk(warm_up=True, fifo=True)))
    for phase, walk, order in candidates:
        if all(order != seen for _, _, seen in found):
            found.append((phase, walk, order))
    return found


def executor_order(index: GraphIndex, nodes: set[int] | None = None,
                   batch_size: int | None = None,
                   bypassed: set[int] | None = None, warm_up: bool = False,
                   fifo: bool = False, reverse: bool = False) -> list[int]:
    """The ops of `nodes` in the order TF's executor runs them, in its steady state or
    in its warm-up (`warm_up`: only CHEAP_OPS run inline), its dispatched ops taken last
    in, first out or (`fifo`) first in, first out. Ops Grappler removes before the step
    (`_grappler_removes`, and `bypassed`) take no turn: they complete with the op that
    readies them, and what they ready is readied by that op. `reverse`: the ops readied
    together through control edges in the reverse of the GraphDef's order (after those
    readied through data edges, in order). Reversing the data-readied ones, or the steady
    state's, made recompute segments run ahead of the gradients that hold them back,
    which measured rewrites do not."""
    return _StepGraph(index, nodes, batch_size, bypassed).walk(warm_up, fifo, reverse)


@dataclass(frozen=True)
class StepTimes:
    """A step's running time as the simulation models it, at one inter-op thread (the ops'
    times added up) and at two (the two-thread walk's length), in cost.op_times's relative
    units: only ratios between graphs of one model mean anything."""

    one_thread: float
    two_threads: float

    def ratio(self, base: StepTimes) -> tuple[float, float]:
        """(one-thread, two-thread) time as a multiple of `base`'s."""
        return (self.one_thread / base.one_thread if base.one_thread else 1.0,
                self.two_threads / base.two_threads if base.two_threads else 1.0)


@dataclass
class TwoThreadWalk:
    """The step as two inter-op threads run it: the ops in the order they start, each
    one's start and end time, and the step's modelled times at one and two threads."""

    order: list[int]
    start_at: list[float]
    end_at: list[float]
    times: StepTimes


def two_thread_order(index: GraphIndex, nodes: set[int] | None = None,
                     batch_size: int | None = None, bypassed: set[int] | None = None
                     ) -> TwoThreadWalk | None:
    """The warm-up as two inter-op threads run it (`_StepGraph.walk_two_threads`): the ops
    in the order they start, with each one's start and end time, from their relative
    running times (cost.py). None for steps with v1 loops, and for steps of more than
    REVERSE_WALK_OPS ops (a simulation more: big synthetic chains keep their time)."""
    from graphmem.analysis.cost import op_times

    if len(nodes if nodes is not None else index.names) > REVERSE_WALK_OPS:
        return None
    step = _StepGraph(index, nodes, batch_size, bypassed)
    if step.has_loops:
        return None
    members = [i for i in range(len(index)) if step.member[i]]
    duration = op_times(index, members, batch_size)
    walked = step.walk_two_threads(duration)
    if walked is None:
        return None
    order, start_at, end_at = walked
    # ops run inline take no time in the walk: one thread's step is the others' times,
    # two threads' when the last op ends
    work = sum(end - start for start, end in zip(start_at, end_at, strict=True))
    return TwoThreadWalk(order, start_at, end_at,
                         StepTimes(work, max(end_at, default=0.0)))


class _StepGraph:
    """The step's ops with their successors, pending counts and which ones run inline:
    built once, walked once per order (executor_walks walks it two or three times)."""

    def __init__(self, index: GraphIndex, nodes: set[int] | None, batch_size: int | None,
                 bypassed: set[int] | None) -> None:
        n = len(index)
        member = bytearray(n)  # 1 for ops in the step
        for i in (nodes if nodes is not None else range(n)):
            member[i] = 1
        ops, data_inputs, control_inputs = index.ops, index.data_inputs, index.control_inputs
        indeg = [0] * n
        succ: list[list[int]] = [[] for _ in range(n)]
        inexpensive = bytearray(n)  # kernels TF marks inexpensive: inline from the start
        learned = bytearray(n)  # those and ops this small: inline once TF knows their cost
        output_sizes = index.output_sizes(batch_size)
        verdicts: dict[int, int] = {}  # id of a list of output sizes (shared) -> all small
        sources: list[int] = []  # ops waiting for none, in topological order
        for i in index.topo:
            if not member[i]:
                continue
            op = ops[i]
            loop_back = op in ("Merge", "RefMerge")
            count = 0
            for s, _ in data_inputs[i]:
                if member[s] and not (loop_back and ops[s] in _BACK_EDGE_SOURCES):
                    succ[s].append(i)
                    count += 1
            for s in control_inputs[i]:
                if member[s]:
                    succ[s].append(i + n)  # a control edge (see _walk)
                    count += 1
            indeg[i] = count
            if not count:
                sources.append(i)
            if op in CHEAP_OPS:
                inexpensive[i] = learned[i] = 1
            else:
                sizes = output_sizes[i]  # lists kept by the index's cache: their ids stay theirs
                verdict = verdicts.get(id(sizes))
                if verdict is None:
                    verdict = verdicts[id(sizes)] = int(
                        all(b is not None and b <= _SMALL_BYTES for b in sizes))
                learned[i] = verdict
        self.index, self.member, self.succ, self.indeg = index, member, succ, indeg
        self.inexpensive, self.learned = inexpensive, learned
        self.transparent = _grappler_removes(index, member, bypassed)
        # per removed op, the op whose output it forwards (-1: none, a NoOp): Grappler
        # gives its readers a data edge from that op
        self.forwards = [data_inputs[i][0][0] if t and data_inputs[i] else -1
                         for i, t in enumerate(self.transparent)]
        if not any(ops[i] == "_Arg" for i in sources):
            # a TF1 step's constants run first: traced (tf-slim AlexNet, one inter-op
            # thread), every root Const ran before the feeds and variables, wherever the
            # GraphDef had it; one built late (a gradient's `zeros`) otherwise holds back
            # the op that reads it, and with it the order of the backward pass
            consts = [i for i in sources if ops[i] in _CONST_OPS]
            if consts:
                sources = consts + [i for i in sources if ops[i] not in _CONST_OPS]
        sources.reverse()
        self.sources = sources
        # a function body (a TF2 train step): its sources start together
        self.function_body = any(ops[i] == "_Arg" for i in self.sources)
        self.has_loops = any(index.frame)  # v1 loops (asked once, not per walk)

    def walk(self, warm_up: bool = False, fifo: bool = False,
             reverse: bool = False) -> list[int]:
        index, member = self.index, self.member
        cheap = self.inexpensive if warm_up else self.learned
        if native is not None and not self.has_loops:  # the same walk in C (native.py)
            order = native.executor_walk(self.succ, self.indeg, cheap, self.transparent,
                                         self.sources, self.function_body, fifo,
                                         self.forwards, reverse)
        else:
            order = self._walk(cheap, fifo, reverse)
        if len(order) != sum(member):  # should not happen on an indexed graph: keep every op
            seen = set(order)
            order.extend(i for i in index.topo if member[i] and i not in seen)
        return order

    def _walk(self, cheap: bytearray, fifo: bool, reverse: bool = False) -> list[int]:
        index, member, succ, transparent = self.index, self.member, self.succ, self.transparent
        n, forwards = len(index), self.forwards
        indeg = list(self.indeg)
        tasks: deque[int] = deque()
        inline: deque[int] = deque()
        if self.function_body:
            inline.extend(reversed(self.sources))
        else:
            tasks.extend(self.sources)
        take = tasks.popleft if fifo else tasks.pop
        order: list[int] = []
        loops = _LoopExits(index, member, self.has_loops)
        looping = loops.active  # v1 loops: Exits wait for their body

        while True:
            while tasks or inline:
                if not inline:
                    inline.append(take())
                i = inline.popleft()
                order.append(i)
                if looping:
                    inline.extend(loops.ran(i))
                # the ops i made ready, in GraphDef order (TF's out-edges are), through
                # ops Grappler removes, which complete at once (and join the order after
                # i). Inline: this runs once per op
                # An op is readied through a data edge or a control edge (a control edge
                # on the path through removed ops makes it a control one, as Grappler
                # rewires it, unless the removed op forwards i's own output); TF
                # activates the data out-edges first, then the control ones, each in
                # GraphDef order, so ready holds `j + n * control`, sorted
                ready: list[int] = []
                removed: list[int] = []  # completed ops Grappler removes, last first
                x, via = i, 0  # via: n when x was reached through a control edge
                while True:
                    for e in succ[x]:
                        if e >= n:
                            j, kind = e - n, n
                        else:
                            j, kind = e, via
                        d = indeg[j] - 1
                        indeg[j] = d
                        if d or (looping and loops.park(j)):
                            continue
                        if transparent[j]:
                            order.append(j)
                            # a removed Identity of i's output: its readers read i's data
                            removed.append(j if forwards[j] == i else j + kind)
                        else:
                            ready.append(j + kind)
                    if not removed:
                        break
                    x = removed.pop()
                    x, via = (x - n, n) if x >= n else (x, 0)
                if len(ready) > 1:
                    if reverse:  # data edges first, the control ones in reverse order
                        ready.sort(key=lambda r: 3 * n - 1 - r if r >= n else r)
                    else:
                        ready.sort()
                expensive = None
                for j in ready:
                    if j >= n:
                        j -= n
                    if cheap[j]:
                        inline.append(j)
                    else:
                        if expensive is not None:
                            tasks.append(expensive)
                        expensive = j
                if expensive is not None:
                    if inline:
                        tasks.append(expensive)
                    else:  # nothing inexpensive runs inline first: this op runs next
                        inline.append(expensive)
            if not loops.active or not loops.parked:
                break
            inline.extend(loops.release_all())  # a body op that never ran: do not stall
        return order

    def walk_two_threads(self, duration: list[float]
                         ) -> tuple[list[int], list[float], list[float]] | None:
        """The warm-up as two inter-op threads run it: the ops in the order they start,
        with each op's start and end time (`duration[i]`: op i's running time, any unit;
        inexpensive ops take none). Each thread runs the last expensive op an op of its
        readies next and queues the others in front of its own queue; it takes its next
        op from the front of that queue, and an idle thread steals the oldest one from
        the back of the other's (TF's executor on Eigen's thread pool). So the second
        thread runs what the first one leaves for later: a weight gradient beside the
        input gradient, a recompute segment beside the gradients still holding memory,
        which no one-thread order shows (tf-slim ResNet-50 v2's memory rewrite measured up
        to 1.24x its one-thread peak at two threads). v1 loops are not walked (None)."""
        n = len(self.index)
        succ, transparent, cheap = self.succ, self.transparent, self.inexpensive
        indeg = list(self.indeg)
        queues: list[deque[int]] = [deque(), deque()]
        starts: list[int] = []
        start_at: list[float] = []
        end_at: list[float] = []
        running: list[tuple[float, int, int]] = []  # (end, thread, op)
        idle = [True, True]

        def instant(i: int, t: float) -> None:
            """Op i runs at time t and takes none (inline, or removed by Grappler)."""
            starts.append(i)
            start_at.append(t)
            end_at.append(t)

        def run(i: int, t: float, thread: int) -> None:
            """Start expensive op i on `thread` at time t."""
            starts.append(i)
            start_at.append(t)
            end = t + duration[i]
            end_at.append(end)
            idle[thread] = False
            heapq.heappush(running, (end, thread, i))

        def complete(i: int, t: float, thread: int) -> int | None:
            """Op i ended at t: run what it readies that is inexpensive (inline, in no
            time), queue the expensive ones but the last, which it returns."""
            inline: deque[int] = deque([i])
            keep = None
            while inline:
                x = inline.popleft()
                if x != i:
                    instant(x, t)
                ready: list[int] = []
                stack = [x]
                while stack:
                    y = stack.pop()
                    for e in succ[y]:
                        j = e - n if e >= n else e
                        indeg[j] -= 1
                        if indeg[j]:
                            continue
                        if transparent[j]:
                            instant(j, t)
                            stack.append(j)
                        else:
                            ready.append(j)
                for j in ready:
                    if cheap[j]:
                        inline.append(j)
                    else:
                        if keep is not None:
                            queues[thread].appendleft(keep)
                        keep = j
            return keep

        sources = list(reversed(self.sources))
        t = 0.0
        for i in sources:  # the step's start: inexpensive sources run, the rest queue
            if cheap[i]:
                instant(i, t)
                keep = complete(i, t, 0)
                if keep is not None:
                    queues[0].appendleft(keep)
            else:
                queues[0].append(i)
        # the first op starts every thread
        while True:
            for th in (0, 1):
                if idle[th]:
                    own, other = queues[th], queues[1 - th]
                    if own:
                        run(own.popleft(), t, th)
                    elif other:
                        run(other.pop(), t, th)
            if not running:
                break
            t, thread, i = heapq.heappop(running)
            idle[thread] = True
            keep = complete(i, t, thread)
            if keep is not None:
                run(keep, t, thread)
        if len(starts) != sum(self.member):  # a cycle or a loop left ops unreached
            return None
        return starts, start_at, end_at


_BACK_EDGE_SOURCES = frozenset({"NextIteration", "RefNextIteration"})
_CONST_OPS = frozenset({"Const", "HostConst"})
_REMOVABLE_TYPES = frozenset({"NoOp", "Identity"})  # see _grappler_removes
_EXITS = frozenset({"Exit", "RefExit"})


class _LoopExits:
    """Holds a v1 loop's Exit ops back until every op of the loop's frame has run.

    The order runs each loop body once and ignores the NextIteration back edges, so an
    Exit is ready as soon as its Switch ran, before the body. TF runs it after the last
    iteration: running it early would start what follows the loop (often the gradient
    loop, whose pops then come before the pushes) while the body is still to come.
    Per frame, one counter of ops still to run: linear in the graph."""

    def __init__(self, index: GraphIndex, member: bytearray, active: bool) -> None:
        """`active`: whether the graph has v1 loop frames at all."""
        self.frame = index.frame
        self.remaining: dict[str, int] = {}
        self.parked: dict[str, list[int]] = {}
        self.body_frame: dict[int, str] = {}
        ops, data_inputs = index.ops, index.data_inputs
        self.active = active
        if not self.active:
            return
        for i, f in enumerate(self.frame):
            if member[i] and f:
                self.remaining[f] = self.remaining.get(f, 0) + 1
            if member[i] and ops[i] in _EXITS and data_inputs[i]:
                self.body_frame[i] = self.frame[data_inputs[i][0][0]]

    def park(self, j: int) -> bool:
        """Whether ready op j is an Exit whose loop body has ops still to run."""
        f = self.body_frame.get(j)
        if f is None or not self.remaining.get(f):
            return False
        self.parked.setdefault(f, []).append(j)
        return True

    def ran(self, i: int) -> list[int]:
        """Exits released by op i, the last of its frame to run."""
        f = self.frame[i]
        if not f:
            return []
        left = self.remaining[f] = self.remaining.get(f, 1) - 1
        return self.parked.pop(f, []) if left <= 0 else []

    def release_all(self) -> list[int]:
        out = [j for parked in self.parked.values() for j in parked]
        self.parked.clear()
        for f in self.remaining:
            self.remaining[f] = 0
        return out


def _grappler_removes(index: GraphIndex, member: bytearray,
                      bypassed: set[int] | None = None) -> bytearray:
    """Ops Grappler's dependency optimizer removes before the step runs: NoOps that only
    group control edges (tf.gradients' `tuple/group_deps`) and the Identity ops that
    forward a tensor with a control input (`tuple/control_dependency`). They run inline in
    no time, but in the graph as written they are the inexpensive work that makes TF
    dispatch an expensive op readied with them; once removed, that op runs at once (a
    recompute segment whose trigger is a gradient matmul starts right after it)."""
    out = bytearray(len(index))
    ops, frame, control_inputs = index.ops, index.frame, index.control_inputs
    for i in compress(range(len(index)), map(_REMOVABLE_TYPES.__contains__, ops)):
        if member[i] and not frame[i] and (ops[i] == "NoOp" or control_inputs[i]):
            out[i] = 1
    for i in bypassed or ():
        if member[i] and not frame[i]:
            out[i] = 1
    return out
