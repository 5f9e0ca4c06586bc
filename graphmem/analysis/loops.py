"""What loops hold for their gradient, sized from the graph: trip counts and accumulators.

A training step through a `tf.while_loop` keeps one value per iteration for the backward
pass: control flow v1 pushes them on stacks (`StackPushV2` in the forward frame,
`StackPopV2` in the gradient frame), control flow v2 appends them to tensor lists that leave
the forward `While` as extra outputs and are popped by the gradient `While`. The graph gives
the element's shape, never the number of elements, so the estimator needs the trip count.
It is derived here when the graph fixes it statically: the loop condition compares a counter
(a start value, a constant step) with a bound that is a constant or computed from static
shapes (the time axis of the input, the batch dimension from `--batch-size`). A loop whose
trip count cannot be known is counted as one iteration and named in `notes`, so an
underestimate is never silent.

Everything here is a fact about the graph, found in time linear in the graph (plus the
bodies of v2 loops, each analysed once).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem.graph import dtypes
from graphmem.graph.dtypes import FLOATS
from graphmem.graph.index import SUM_OPS, V2_LOOP_OPS, GraphIndex, Tensor, attr_of, nbytes

_FORWARDS = frozenset({"Identity", "Enter", "RefEnter", "Cast", "Snapshot", "StopGradient"})
_COMPARE = frozenset({"Less", "LessEqual", "Greater", "GreaterEqual"})
_ADD = frozenset({"Add", "AddV2"})
_MAX_DEPTH = 24  # static values are small expressions; a deeper one is not worth following


@dataclass
class Loop:
    """One loop of the step and how many iterations it runs."""

    name: str  # v1: the frame's name; v2: the While node's name
    kind: str  # "v1" or "v2"
    trip_count: int | None
    how: str  # how the trip count was found, or why it could not be
    accumulators: int = 0  # values it keeps per iteration for the gradient
    # bytes of running-sum terms that iterations run ahead of the sum can hold at once,
    # beyond one iteration's (running_sums below); for a term that waits for its sum, the inputs it keeps
    run_ahead_bytes: int = 0


@dataclass
class LoopFacts:
    """Sizes and lifetimes the memory simulation cannot read off shapes alone.

    v1 (stacks): a pushed value stays alive until the matching pop, and the stack holds
    `steps - 1` more elements of that size from the moment the value is computed until the
    end of the gradient loop (`release_frame`). The simulation runs a body once, as the
    forward loop's last iteration and the gradient loop's first, where the stacks are
    fullest; it counts from the value's producer, not from the push, because its one-pass
    order may run a push late (the push waits for the stack's handle, a root the executor
    creates first) while TF pushes in every iteration.
    v2 (tensor lists): the byte size of list outputs (`output_bytes`, trip count x element),
    and the peak of one iteration of each While body (`body_peak`), which is live while
    the While op runs."""

    loops: list[Loop] = field(default_factory=list)
    push_steps: dict[int, int] = field(default_factory=dict)  # StackPushV2 -> elements
    pushed: dict[Tensor, int] = field(default_factory=dict)  # pushed tensor -> its push
    pop_source: dict[int, Tensor] = field(default_factory=dict)  # StackPopV2 -> pushed tensor
    release_frame: dict[int, str] = field(default_factory=dict)  # StackPushV2 -> frame
    outer_frame: dict[str, str] = field(default_factory=dict)  # frame -> outermost frame
    output_bytes: dict[Tensor, int] = field(default_factory=dict)
    body_peak: dict[int, int] = field(default_factory=dict)
    # While -> the allocations of the running-sum terms its iterations run ahead can hold
    # beyond one iteration's (each its own request, as TF allocates them)
    run_ahead: dict[int, list[int]] = field(default_factory=dict)

    @property
    def notes(self) -> list[str]:
        return [f"loop {lp.name}: trip count unknown ({lp.how}), accumulators counted as "
                "one step" for lp in self.loops if lp.trip_count is None and lp.accumulators]

    def release_positions(self, frame_end: dict[str, int]) -> dict[int, int]:
        """For each push, the position after which its accumulator is freed: the last op
        of the outermost frame its pops run in (the end of the gradient loop), from the
        last position of each frame in the simulated order."""
        if not self.release_frame:
            return {}
        last: dict[str, int] = {}
        for f, p in frame_end.items():
            top = self.outer_frame.get(f, f)
            if p > last.get(top, -1):
                last[top] = p
        end = max(frame_end.values(), default=0)
        return {push: last.get(f, end) for push, f in self.release_frame.items()}

    def is_empty(self) -> bool:
        return not (self.push_steps or self.output_bytes or self.body_peak
                    or self.run_ahead)


# the peak of one iteration of a v2 loop body: (body index, batch size, library, depth) ->
# bytes. Supplied by the memory simulation (memory.py), which uses these facts: passed in
# rather than imported, so that the loop facts do not depend on the simulator.
BodyPeak = Callable[[GraphIndex, "int | None", Message, int], int]


def analyze_loops(index: GraphIndex, batch_size: int | None,
                  library: Message | None = None, _depth: int = 0,
                  body_peak: BodyPeak | None = None) -> LoopFacts:
    """Loop facts of `index`; `library` holds the bodies of v2 While ops (the graph's own
    function library by default). `body_peak` sizes one iteration of each v2 body
    (`body_peak` of the facts); without it those stay 0."""
    facts = LoopFacts()
    ops = index.ops
    has_v1 = any(index.frame)
    op_types = set(ops)
    if not has_v1 and not op_types & (V2_LOOP_OPS | {"TensorListFromTensor"}):
        return facts  # most graphs: two quick scans, nothing to size
    whiles = [i for i in range(len(index)) if ops[i] in V2_LOOP_OPS] if op_types & V2_LOOP_OPS else []
    values = StaticValues(index, batch_size)
    if has_v1:
        _v1_stacks(index, values, facts)
    for i in range(len(index)):
        if ops[i] == "TensorListFromTensor" and index.data_inputs[i]:
            src = index.data_inputs[i][0]
            b = index.output_bytes(batch_size)(src[0])
            if src[1] < len(b) and b[src[1]]:
                facts.output_bytes[(i, 0)] = b[src[1]]  # the list copies its input
    if whiles:
        if library is None:
            library = index.graph_def.library
        functions = {f.signature.name: f for f in library.function}
        bodies = _Bodies(index, functions, batch_size, library, _depth, body_peak)
        for w in whiles:  # in file order: a gradient While follows its forward While
            _v2_while(index, w, values, bodies, facts)
    return facts


# ---- static values ---------------------------------------------------------------------
class StaticValues:
    """Integer values a graph fixes before it runs: constants, static shapes and small
    arithmetic on them. `args` gives the values of a function body's arguments, `extra`
    values found elsewhere (the final counter of a While)."""

    def __init__(self, index: GraphIndex, batch_size: int | None,
                 args: dict[int, int | list[int] | None] | None = None) -> None:
        self.index = index
        self.batch_size = batch_size
        self.args = args or {}
        self.extra: dict[Tensor, int] = {}
        self._memo: dict[Tensor, int | list[int] | None] = {}

    def forget(self) -> None:
        """Drop remembered values (after `extra` learnt more)."""
        self._memo.clear()

    def scalar(self, t: Tensor) -> int | None:
        v = self.value(t)
        if isinstance(v, list):
            return v[0] if len(v) == 1 else None
        return v

    def value(self, t: Tensor, depth: int = 0) -> int | list[int] | None:
        if t in self.extra:
            return self.extra[t]
        if t in self._memo:
            return self._memo[t]
        v = self._compute(t, depth) if depth < _MAX_DEPTH else None
        self._memo[t] = v
        return v

    def _compute(self, t: Tensor, depth: int) -> int | list[int] | None:
        ix = self.index
        i, k = t
        op = ix.ops[i]
        ins = ix.data_inputs[i]
        node = ix.node(i)
        if op in ("Const", "HostConst"):
            return const_ints(node)
        if op == "_Arg":
            return self.args.get(node.attr["index"].i) if "index" in node.attr else None
        if op in _FORWARDS:
            return self.value(ins[0], depth + 1) if ins else None
        if op in ("Merge", "RefMerge") and len(ins) == 2 and k == 0:
            # a value a loop passes on unchanged (lowered v2 loops carry their bounds so)
            entry, back = ins
            if ix.ops[back[0]] in ("NextIteration", "RefNextIteration") and ix.data_inputs[
                    back[0]] and _passes_through(ix, ix.data_inputs[back[0]][0][0], i):
                return self.value(entry, depth + 1)
            return None
        if op == "Shape" and ins:
            shape = ix.shape(ins[0])
            if shape is None:
                return None
            return [self.batch_size if d < 0 and a == 0 and self.batch_size else d
                    for a, d in enumerate(shape)]
        if op == "StridedSlice" and len(ins) == 4:
            return self._strided_slice(node, [self.value(s, depth + 1) for s in ins])
        if op in ("Minimum", "Maximum", "Add", "AddV2", "Sub", "Mul") and len(ins) == 2:
            a, b = self.value(ins[0], depth + 1), self.value(ins[1], depth + 1)
            a, b = _as_scalar(a), _as_scalar(b)
            if a is None or b is None or a < 0 or b < 0:
                return None
            return {"Minimum": min, "Maximum": max, "Add": int.__add__, "AddV2": int.__add__,
                    "Sub": int.__sub__, "Mul": int.__mul__}[op](a, b)
        return None

    @staticmethod
    def _strided_slice(node: Message, args: list) -> int | list[int] | None:
        """The common `shape[i]` form: a 1-D input, one index, shrink_axis_mask 1."""
        vec, begin, end, strides = args
        if not isinstance(vec, list) or begin is None or strides not in (1, [1]):
            return None
        begin = _as_scalar(begin)
        if begin is None or not -len(vec) <= begin < len(vec):
            return None
        if attr_of(node, "shrink_axis_mask").i & 1:
            v = vec[begin]
            return v if v >= 0 else None
        end = _as_scalar(end)
        if end is None or attr_of(node, "ellipsis_mask").i or attr_of(node, "new_axis_mask").i:
            return None
        if attr_of(node, "end_mask").i & 1:
            end = len(vec)
        part = vec[begin:end]
        return part if all(d >= 0 for d in part) else None


def _passes_through(ix: GraphIndex, i: int, merge: int) -> bool:
    """Whether op i is `merge`'s own value, through Identity and Switch ops."""
    for _ in range(6):
        if i == merge:
            return True
        if ix.ops[i] not in ("Identity", "Switch", "RefSwitch") or not ix.data_inputs[i]:
            return False
        i = ix.data_inputs[i][0][0]
    return i == merge


def _as_scalar(v) -> int | None:
    if isinstance(v, list):
        return v[0] if len(v) == 1 else None
    return v


def const_ints(node: Message) -> int | list[int] | None:
    """The value of an int32/int64 Const: an int for a scalar, a list for a vector."""
    if "value" not in node.attr:
        return None
    tp = node.attr["value"].tensor
    dims = [d.size for d in tp.tensor_shape.dim]
    if len(dims) > 1:
        return None
    count = dims[0] if dims else 1
    if count > 64:
        return None
    if tp.dtype == dtypes.INT32:
        vals = list(tp.int_val) or (list(struct.unpack(f"<{len(tp.tensor_content) // 4}i",
                                                       tp.tensor_content))
                                     if tp.tensor_content else [])
    elif tp.dtype == dtypes.INT64:
        vals = list(tp.int64_val) or (list(struct.unpack(f"<{len(tp.tensor_content) // 8}q",
                                                         tp.tensor_content))
                                       if tp.tensor_content else [])
    else:
        return None
    if not vals:  # no values written: all zeros
        vals = [0] * count
    if len(vals) < count:  # TF writes a repeated value once
        vals += [vals[-1]] * (count - len(vals))
    return vals if dims else vals[0]


def trip_from_compare(op: str, init: int, step: int, bound: int) -> int | None:
    """Iterations of `i = init; while i <op> bound: i += step`."""
    if op in ("Less", "LessEqual") and step > 0:
        span = bound - init + (1 if op == "LessEqual" else 0)
        return max(0, math.ceil(span / step))
    if op in ("Greater", "GreaterEqual") and step < 0:
        span = init - bound + (1 if op == "GreaterEqual" else 0)
        return max(0, math.ceil(span / -step))
    return None


# ---- control flow v1 -------------------------------------------------------------------
def _v1_stacks(index: GraphIndex, values: StaticValues, facts: LoopFacts) -> None:
    ops, ins, frame = index.ops, index.data_inputs, index.frame
    parent: dict[str, str] = {}
    for i in range(len(index)):
        if ops[i] in ("Enter", "RefEnter") and ins[i]:
            parent.setdefault(frame[i], frame[ins[i][0][0]])
    outer: dict[str, str] = {}
    for f in parent:
        top = f
        seen = 0
        while parent.get(top) and seen < 64:
            top, seen = parent[top], seen + 1
        outer[f] = top
    facts.outer_frame = outer
    ta_sizes = _tensor_array_sizes(index, values)
    conds = [i for i in range(len(index)) if ops[i] == "LoopCond" and ins[i]]
    trips: dict[str, tuple[int | None, str]] = {}
    for _round in range(2):  # the second round sees the final counters of the first
        for i in conds:
            if trips.get(frame[i], (None,))[0] is not None:
                continue
            trip, how = _pred_trip(index, values, ins[i][0], frame[i], 0)
            if trip is None and ta_sizes.get(frame[i]) is not None:
                trip, how = ta_sizes[frame[i]], "size of the TensorArray the loop reads"
            trips[frame[i]] = (trip, how)
        if all(t[0] is not None for t in trips.values()) or \
                not _final_counters(index, values, trips):
            break
    # accumulators: a StackV2, or a tensor list in a lowered v2 loop (EmptyTensorList
    # carried through the frames), with its pushes and pops
    pushes: dict[int, list[int]] = {}
    pops: dict[int, list[int]] = {}
    for i in range(len(index)):
        if ops[i] in _PUSH_POP and ins[i] and frame[i]:
            root = _accumulator_root(index, ins[i][0][0])
            if ops[root] in _ACCUMULATORS:
                (pushes if ops[i] in _PUSHES else pops).setdefault(root, []).append(i)
    counted: dict[str, int] = {}
    for stack, push_list in pushes.items():
        for p in push_list:
            if len(ins[p]) < 2:
                continue
            steps, known = 1, True
            f = frame[p]
            depth = 0
            while f and depth < 64:
                trip = trips.get(f, (None, "no LoopCond"))[0]
                if trip is None:
                    known = False
                else:
                    steps *= trip
                f, depth = parent.get(f, ""), depth + 1
            if ops[ins[p][1][0]] not in ("Const", "HostConst"):
                # a constant pushed in place of a value recomputed in the gradient loop
                # (passes/loop_recompute_v1.py) shares one buffer: no accumulator
                counted[frame[p]] = counted.get(frame[p], 0) + 1
            facts.push_steps[p] = steps if known else 1
            facts.pushed.setdefault(ins[p][1], p)
            stack_pops = pops.get(stack, [])
            if stack_pops:
                facts.pop_source[stack_pops[0]] = ins[p][1]
                facts.release_frame[p] = outer.get(frame[stack_pops[0]], frame[stack_pops[0]])
    for f, (trip, how) in trips.items():
        facts.loops.append(Loop(f.lstrip("/"), "v1", trip, how, counted.get(f, 0)))


def _final_counters(index: GraphIndex, values: StaticValues,
                    trips: dict[str, tuple[int | None, str]]) -> bool:
    """Give each Exit of a counter of a loop with a known trip count its final value (a
    gradient loop counts down from the forward loop's count). Returns whether any was
    found."""
    found = False
    for i in range(len(index)):
        if index.ops[i] not in ("Exit", "RefExit") or not index.data_inputs[i]:
            continue
        sw = index.data_inputs[i][0][0]
        if index.ops[sw] not in ("Switch", "RefSwitch") or not index.data_inputs[sw]:
            continue
        trip = trips.get(index.frame[sw], (None,))[0]
        counter = _v1_counter(index, values, index.data_inputs[sw][0]) if trip is not None \
            else None
        if counter is not None:
            values.extra[(i, 0)] = counter[0] + trip * counter[1]
            found = True
    if found:
        values.forget()
    return found


_PUSHES = frozenset({"StackPushV2", "TensorListPushBack"})
_PUSH_POP = _PUSHES | {"StackPopV2", "TensorListPopBack"}
_ACCUMULATORS = frozenset({"StackV2", "EmptyTensorList", "TensorListReserve"})
_CARRIERS = frozenset({"Identity", "Enter", "RefEnter", "Exit", "RefExit", "Switch",
                       "RefSwitch", "Merge", "RefMerge", "TensorListPushBack",
                       "TensorListPopBack"})


def _accumulator_root(index: GraphIndex, i: int) -> int:
    """The StackV2 or tensor list behind a handle: up through Enter / Identity, and for a
    lowered v2 loop's list through Merge (its entry), Switch, Exit and earlier pushes."""
    ops, ins = index.ops, index.data_inputs
    for _ in range(32):
        if ops[i] not in _CARRIERS or not ins[i]:
            break
        i = ins[i][0][0]
    return i


def _source(index: GraphIndex, i: int) -> int:
    """The op behind a chain of Enter / Identity ops (a handle entering a frame)."""
    for _ in range(8):
        if index.ops[i] not in _FORWARDS or not index.data_inputs[i]:
            break
        i = index.data_inputs[i][0][0]
    return i


def _pred_trip(index, values, t: Tensor, frame: str, depth: int) -> tuple[int | None, str]:
    ops, ins = index.ops, index.data_inputs
    i = t[0]
    op = ops[i]
    if depth > 8:
        return None, "condition too deep"
    if op == "LogicalAnd" and len(ins[i]) == 2:
        found = [_pred_trip(index, values, s, frame, depth + 1) for s in ins[i]]
        known = [f for f in found if f[0] is not None]
        if known:
            return min(known)
        return None, found[0][1]
    if op in ("Identity", "Switch"):
        return _pred_trip(index, values, ins[i][0], frame, depth + 1) if ins[i] else (None, op)
    if op in _COMPARE and len(ins[i]) == 2:
        counter = _v1_counter(index, values, ins[i][0])
        bound = values.scalar(ins[i][1])
        if counter is None:
            return None, f"{index.names[i]}: no counter with a static start and step"
        if bound is None:
            return None, f"{index.names[i]}: the bound is not static"
        trip = trip_from_compare(op, counter[0], counter[1], bound)
        if trip is None:
            return None, f"{index.names[i]}: the counter does not move towards the bound"
        return trip, f"{index.names[i]}: counter from {counter[0]} step {counter[1]} to {bound}"
    return None, f"the condition is a {op}"


def _v1_counter(index, values, t: Tensor) -> tuple[int, int] | None:
    """(start, step) of `Merge(Enter(start), NextIteration(Add(Identity(Switch(Merge)),
    step)))`."""
    ops, ins = index.ops, index.data_inputs
    m = t[0]
    for _ in range(4):
        if ops[m] == "Identity" and ins[m]:
            m = ins[m][0][0]
    if ops[m] not in ("Merge", "RefMerge") or len(ins[m]) != 2:
        return None
    start = step = None
    for s, _ in ins[m]:
        if ops[s] in ("Enter", "RefEnter") and ins[s]:
            start = values.scalar(ins[s][0])
        elif ops[s] in ("NextIteration", "RefNextIteration") and ins[s]:
            a = ins[s][0][0]
            if ops[a] not in _ADD and ops[a] != "Sub" or len(ins[a]) != 2:
                return None
            pairs = [ins[a]] if ops[a] == "Sub" else [ins[a], ins[a][::-1]]
            for x, y in pairs:
                if _source_through_switch(index, x[0]) == m:
                    step = values.scalar(y)
                    if step is not None and ops[a] == "Sub":
                        step = -step
    if start is None or step is None:
        return None
    return start, step


def _source_through_switch(index, i: int) -> int:
    for _ in range(6):
        if index.ops[i] not in ("Identity", "Switch", "RefSwitch") or not index.data_inputs[i]:
            break
        i = index.data_inputs[i][0][0]
    return i


def _tensor_array_sizes(index, values) -> dict[str, int | None]:
    """Per frame, the size of a TensorArray read inside it (dynamic_rnn reads its input,
    one element per step): an upper bound of the trip count, used when the condition
    gives none."""
    found: dict[str, int | None] = {}
    for i in range(len(index)):
        if index.ops[i] == "TensorArrayReadV3" and index.data_inputs[i] and \
                found.get(index.frame[i]) is None:
            ta = _source(index, index.data_inputs[i][0][0])
            if index.ops[ta] == "TensorArrayV3" and index.data_inputs[ta]:
                found[index.frame[i]] = values.scalar(index.data_inputs[ta][0])
    return found


# ---- control flow v2 -------------------------------------------------------------------
@dataclass
class _Body:
    index: GraphIndex
    rets: list[Tensor | None]  # the tensor each loop variable's result comes from
    args: dict[int, int]  # argument position -> _Arg node
    peak: int = 0


class _Bodies:
    """Function bodies of While ops as indexed graphs, built once per function."""

    def __init__(self, index, functions, batch_size, library, depth,
                 body_peak: BodyPeak | None) -> None:
        self.registry = index.registry
        self.body_peak = body_peak
        self.functions = functions
        self.batch_size = batch_size
        self.library = library
        self.depth = depth
        self._cache: dict[str, _Body | None] = {}

    def get(self, name: str, with_peak: bool = False) -> _Body | None:
        if name not in self._cache:
            self._cache[name] = self._build(name)
        body = self._cache[name]
        if body is not None and with_peak and body.peak == 0 and self.depth < 8 \
                and self.body_peak is not None:
            body.peak = self.body_peak(body.index, self.batch_size, self.library,
                                       self.depth + 1)
        return body

    def _build(self, name: str) -> _Body | None:
        from graphmem.graph.function_view import ARG_OP, RETVAL_OP, FunctionView

        fn = self.functions.get(name)
        if fn is None:
            return None
        try:
            view = FunctionView.build(fn, self.registry)
        except Exception:  # a body graphmem cannot read: no facts, never a failure
            return None
        ix = GraphIndex.build(view.graph_def, self.registry)
        args = {ix.node(i).attr["index"].i: i for i in range(len(ix)) if ix.ops[i] == ARG_OP}
        rets: list[Tensor | None] = [ix.under_identities(ix.data_inputs[i][0])
                                     if ix.data_inputs[i] else None
                                     for i in range(len(ix)) if ix.ops[i] == RETVAL_OP]
        return _Body(ix, rets, args)


def _v2_while(index: GraphIndex, w: int, values: StaticValues, bodies: _Bodies,
              facts: LoopFacts) -> None:
    node = index.node(w)
    body = bodies.get(node.attr["body"].func.name, with_peak=True)
    cond = bodies.get(node.attr["cond"].func.name)
    name = index.names[w]
    if body is None:
        facts.loops.append(Loop(name, "v2", None, "body function not in the library"))
        return
    facts.body_peak[w] = body.peak
    ins = index.data_inputs[w]
    trip, how = _v2_trip(index, w, values, body, cond)
    ahead = _run_ahead_terms(index, w, body, trip, values.batch_size)
    if ahead:
        facts.run_ahead[w] = ahead
    counted: set[Tensor] = set()
    accumulators = 0
    # PushBack (gradient accumulators) before SetItem (TensorArray writes): an element in
    # both lists is one buffer, counted with the list that lives longer
    for kind in ("TensorListPushBack", "TensorListSetItem"):
        for k, r in enumerate(body.rets):
            if r is None or k >= len(ins) or body.index.ops[r[0]] != kind:
                continue
            item_ix = 1 if kind == "TensorListPushBack" else 2
            item_ins = body.index.data_inputs[r[0]]
            if len(item_ins) <= item_ix:
                continue
            elem = item_ins[item_ix]
            if elem in counted:
                facts.output_bytes[(w, k)] = 0
                continue
            counted.add(elem)
            b = _element_bytes(body.index, elem, values.batch_size)
            if b and body.index.ops[elem[0]] == "_Arg" and _invariant_arg(body, elem[0]):
                b = 0  # a loop invariant: every element is the same buffer
            if b is None:
                b = list_element_bytes(index, ins[k], values)
            if b is None:
                continue
            if kind == "TensorListSetItem" and not _grows(index, ins[k]):
                facts.output_bytes[(w, k)] = 0  # it replaces elements the list has
                continue
            if kind == "TensorListPushBack" and body.index.ops[elem[0]] != "Const":
                accumulators += 1  # (a constant is graphmem's stand-in for a rebuilt value)
            facts.output_bytes[(w, k)] = (trip if trip is not None else 1) * \
                allocation_bytes(b)
    # the final value of each counter is known once the trip count is
    if trip is not None:
        for k in range(len(body.rets)):
            c = _v2_counter_step(body, k)
            if c is not None and k < len(ins):
                start = values.scalar(ins[k])
                if start is not None:
                    values.extra[(w, k)] = start + trip * c
    facts.loops.append(Loop(name, "v2", trip, how, accumulators, sum(ahead)))


@dataclass(frozen=True)
class RunningSum:
    """A loop variable summed over the iterations: `sum_out = Add(sum_in, term, ...)`."""

    arg: int  # the body's `_Arg` of the variable (sum_in)
    op: int  # the sum returned for it
    terms: tuple[Tensor, ...]  # what is added each iteration

    def waits(self, ix: GraphIndex, term: int) -> bool:
        """Whether a term's op waits for the incoming sum (loop_recompute's edge)."""
        return self.arg in ix.control_inputs[term]


def running_sums(ix: GraphIndex, args: dict[int, int],
                 rets: dict[int, Tensor]) -> list[RunningSum]:
    """The floating loop variables of a v2 loop body (`args`: position -> `_Arg`, `rets`:
    position -> the tensor returned) that each iteration adds a term to. A gradient loop
    sums a loop-invariant weight's gradient so (an LSTM kernel's, `h^T . d_gates`), and
    since a term needs nothing from the sum, TF's executor runs up to `parallel_iterations`
    iterations ahead of it, each term waiting for the Add: traced on the benchmarks' Keras
    LSTM LM (keras_lstm_lm), 32 kernel-sized terms live at once."""
    from graphmem.graph.function_view import ARG_OP

    found = []
    for k, r in rets.items():
        arg = args.get(k)
        if r is None or arg is None:
            continue
        op = ix.through_identity(r[0])
        if ix.ops[op] not in SUM_OPS or ix.dtype((arg, 0)) not in FLOATS:
            continue
        ins = ix.data_inputs[op]
        if not any(ix.through_identity(s) == arg for s, _ in ins):
            continue
        terms = tuple(dict.fromkeys(
            (s, j) for s, j in ins if ix.through_identity(s) != arg
            and ix.ops[s] not in (ARG_OP, "Const")))
        if terms:
            found.append(RunningSum(arg, op, terms))
    return found


# Terms smaller than this were not seen to run ahead: TF runs such small kernels inline
# in its steady state (benchmarks/inline_ops.py: ops moving 128-256 KiB ran inline in 20%
# of cases, larger ones almost never), and a GRU of the model sweep (12 steps, 10 KiB
# terms) measured about two iterations' terms over one, never eleven.
RUN_AHEAD_MIN_BYTES = 256 * 1024


def held_inputs(ix: GraphIndex, term: int) -> list[Tensor]:
    """The tensors a running-sum term's op keeps while it waits for the incoming sum: its
    data inputs made in the iteration (not a loop argument, a constant or a variable's
    read). Iterations run ahead of the sum make them (an LSTM's gate gradients `dz` are
    on the chain that carries the gradient back), so each iteration ahead holds them."""
    from graphmem.graph.function_view import ARG_OP

    return list(dict.fromkeys(
        t for t in ix.data_inputs[term]
        if ix.ops[ix.through_identity(t[0])] not in (ARG_OP, "Const", "ReadVariableOp")))


def holding_pays(ix: GraphIndex, term: Tensor, sizes: Callable[[int], list[int | None]]
                 ) -> bool:
    """Whether making a running-sum term wait for the sum holds fewer bytes per iteration
    ahead than letting it run: the term itself (an LSTM kernel's gradient, [inputs +
    units, 4 units]) against the inputs it would keep while waiting ([batch, 4 units] and
    [batch, inputs + units]). A small LSTM at a large batch has larger inputs than terms
    (the fixtures' lstm_v2, batch 64: 44 KiB of inputs per 24 KiB term, traced with
    eleven iterations' inputs live); unknown sizes: it pays."""
    own = _size(sizes, term)
    kept = [_size(sizes, t) for t in held_inputs(ix, term[0])]
    if own is None or any(b is None for b in kept):
        return True
    return own > sum(kept)


def _size(sizes: Callable[[int], list[int | None]], t: Tensor) -> int | None:
    out = sizes(t[0])
    return out[t[1]] if t[1] < len(out) else None


def _run_ahead_terms(index: GraphIndex, w: int, body: _Body, trip: int | None,
                     batch_size: int | None) -> list[int]:
    """What iterations run ahead of a loop's running sums hold beyond one iteration, one
    entry per allocation: `min(parallel_iterations, trip) - 1` more terms of each sum
    whose terms do not wait for it, for terms of at least RUN_AHEAD_MIN_BYTES, and as
    many more of the inputs of each term that waits for it (`held_inputs`, whatever their
    size: they wait for the sum, not for a kernel run inline). An unknown trip count is
    taken as `parallel_iterations`: the bound a training run can reach (traced on a TF1
    LSTM in a v2 loop, 64 steps: 31 iterations' terms live beside the current one's,
    `parallel_iterations` being 32)."""
    attrs = index.node(w).attr  # (asked with `in`: indexing a map would add the key)
    parallel = (attrs["parallel_iterations"].i if "parallel_iterations" in attrs else 0) or 10
    ahead = min(parallel, trip if trip is not None else parallel) - 1
    if ahead <= 0:
        return []
    rets = {k: r for k, r in enumerate(body.rets) if r is not None}
    sizes = body.index.output_bytes(batch_size)
    terms = []
    kept: set[Tensor] = set()
    for s in running_sums(body.index, body.args, rets):
        for p, j in s.terms:
            if s.waits(body.index, p):
                for t in held_inputs(body.index, p):
                    b = _size(sizes, t)
                    if b and t not in kept:
                        kept.add(t)
                        terms.append(b)
                continue
            b = _size(sizes, (p, j))
            if b and b >= RUN_AHEAD_MIN_BYTES:
                terms.append(b)
    return terms * ahead


def _invariant_arg(body: _Body, arg: int) -> bool:
    """Whether a body argument is returned unchanged (a loop invariant)."""
    k = body.index.node(arg).attr["index"].i
    return k < len(body.rets) and body.rets[k] == (arg, 0)


def _grows(index: GraphIndex, lst: Tensor) -> bool:
    """Whether a list entering a loop starts without elements, so that setting items fills
    it (a TensorArray written one step at a time)."""
    return index.ops[_source(index, lst[0])] in ("TensorListReserve", "EmptyTensorList")


def _element_bytes(ix: GraphIndex, t: Tensor, batch_size: int | None) -> int | None:
    """Bytes of one pushed element; 0 when it is a variable's buffer (a read shares it)."""
    if ix.ops[t[0]] in ("ReadVariableOp", "Const"):
        return 0
    sizes = ix.output_bytes(batch_size)(t[0])
    return sizes[t[1]] if t[1] < len(sizes) else None


def list_element_bytes(index: GraphIndex, lst: Tensor, values: StaticValues) -> int | None:
    """Element bytes from the list's constructor (EmptyTensorList / TensorListReserve)."""
    i = _source(index, lst[0])
    if index.ops[i] not in ("EmptyTensorList", "TensorListReserve") or not index.data_inputs[i]:
        return None
    shape = values.value(index.data_inputs[i][0])
    node = index.node(i)
    dtype = node.attr["element_dtype"].type if "element_dtype" in node.attr else None
    if isinstance(shape, int):
        shape = [] if shape == -1 else None  # -1: unknown rank
    if shape is None or dtype is None:
        return None
    return nbytes(shape, dtype, values.batch_size)


def _v2_counter_step(body: _Body, k: int) -> int | None:
    """The step of loop variable k when the body returns `arg_k + constant`."""
    r = body.rets[k] if k < len(body.rets) else None
    if r is None:
        return None
    ix = body.index
    a = r[0]
    if ix.ops[a] not in _ADD or len(ix.data_inputs[a]) != 2:
        return None
    arg = body.args.get(k)
    local = StaticValues(ix, None)
    for x, y in (ix.data_inputs[a], ix.data_inputs[a][::-1]):
        if x[0] == arg:
            step = local.scalar(y)
            if step is not None:
                return step
    return None


def _v2_trip(index: GraphIndex, w: int, values: StaticValues, body: _Body,
             cond: _Body | None) -> tuple[int | None, str]:
    """Trip count from the cond function: comparisons of a counter (body returns arg + a
    constant) with a loop-invariant bound of static value, combined by LogicalAnd."""
    if cond is None or not cond.rets or cond.rets[0] is None:
        return None, "cond function not in the library"
    ins = index.data_inputs[w]
    outer = {k: values.value(t) for k, t in enumerate(ins)}

    def invariant(k: int) -> bool:
        r = body.rets[k] if k < len(body.rets) else None
        return r is not None and r[0] == body.args.get(k)

    cix = cond.index
    arg_pos = {i: k for k, i in cond.args.items()}
    local = StaticValues(cix, values.batch_size,
                         {k: v for k, v in outer.items() if invariant(k)})

    def walk(t: Tensor, depth: int) -> tuple[int | None, str]:
        i = t[0]
        op = cix.ops[i]
        if depth > 8:
            return None, "condition too deep"
        if op == "Identity" and cix.data_inputs[i]:
            return walk(cix.data_inputs[i][0], depth + 1)
        if op == "LogicalAnd" and len(cix.data_inputs[i]) == 2:
            found = [walk(s, depth + 1) for s in cix.data_inputs[i]]
            known = [f for f in found if f[0] is not None]
            return min(known) if known else found[0]
        if op in _COMPARE and len(cix.data_inputs[i]) == 2:
            a, b = cix.data_inputs[i]
            k = arg_pos.get(a[0])
            if k is None:
                return None, f"{cix.names[i]}: compares no loop variable"
            step = _v2_counter_step(body, k)
            start = _as_scalar(outer.get(k))
            bound = local.scalar(b)
            if step is None or start is None:
                return None, f"{cix.names[i]}: no counter with a static start and step"
            if bound is None:
                return None, f"{cix.names[i]}: the bound is not static"
            trip = trip_from_compare(op, start, step, bound)
            if trip is None:
                return None, f"{cix.names[i]}: the counter does not move towards the bound"
            return trip, f"{cix.names[i]}: counter from {start} step {step} to {bound}"
        return None, f"the condition is a {op}"

    trip, how = walk(cond.rets[0], 0)
    if trip is None:  # the accumulators' capacity (TensorListReserve / EmptyTensorList)
        for t in ins:
            i = _source(index, t[0])
            if index.ops[i] in ("TensorListReserve", "EmptyTensorList") and \
                    len(index.data_inputs[i]) > 1:
                n = values.scalar(index.data_inputs[i][1])
                if n is not None and n > 0:
                    return n, f"capacity of {index.names[i]}"
    return trip, how


def allocation_bytes(nbytes: int) -> int:
    """Bytes TF's BFC allocator reserves for a buffer (multiples of 256): matters where a
    loop keeps one small tensor (a shape, a counter) per iteration."""
    return -(-nbytes // 256) * 256 if nbytes else 0


# op -> its output that hands out an element a tensor list already holds (no new buffer)
ELEMENT_VIEW_OUTPUT = {"TensorListGetItem": 0, "TensorListPopBack": 1}


def element_view(op: str, k: int) -> bool:
    """Outputs that hand out an element a tensor list already holds (no new buffer)."""
    return ELEMENT_VIEW_OUTPUT.get(op) == k


