"""Recompute inside control-flow-v1 loops: stack fewer values per iteration.

A v1 while loop with a gradient loop pushes every forward value the gradient loop reads on
a stack (see analysis/v1_loop_frames.py), and those stacks, trip count x element each, are
the peak of an LSTM's training step. Most of them are cheap functions of a few others
within one iteration: an LSTM cell's gates come from its input, its state (c, h) and the
weights. This pass keeps the values that cannot be recomputed cheaply and recomputes the
rest in the gradient frame:

- kept: loop-carried values (the frame's Merge / Switch outputs and their Identity),
  outputs of stateful ops (TensorArray reads of the input, variable reads, random ops),
  values of variables read through ref Enters, values the pass cannot copy, and
  with the speed policy, matmul and convolution outputs;
- recomputed: every other pushed value larger than one allocation unit whose producers,
  walked back within the iteration, end in kept values, loop invariants (`Enter` with
  is_constant) and constants.

For each recomputed value its push now pushes a scalar constant of the same dtype (made in
the forward frame, so the stack's push and pop order, which pairs the other stacks'
iterations, stays as TF built it; a Const costs no allocation), and in the gradient frame
the readers of its pop read a copy of the forward ops that compute it instead, fed by the
pops of the kept values (the same iteration's) and by the invariants entered into the
gradient frame. A kept value that no stack carries yet gets one, cloned from an existing
stack of the loop (same counters, same sync). The copies of an iteration wait (control
edges) for the gradient loop's loop variables of that iteration, so the gradient loop,
whose counter may run up to `parallel_iterations` ahead, does not recompute many
iterations at once.

A loop is left as it is when the analysis finds it unsafe (nested frames, conditionals in
the body, unusual stacks), and a value stays stacked when its producers reach something the
pass cannot copy or keep; the report says which and why. A loop is only rewritten when the
bytes it stops stacking exceed those of the stacks it adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.loops import allocation_bytes, analyze_loops
from graphmem.analysis.op_classes import EXPENSIVE_OPS
from graphmem.analysis.v1_loop_frames import Stack, V1Loop, find_v1_loops
from graphmem.graph import dtypes
from graphmem.graph.builders import add_scalar_const, unique_name
from graphmem.graph.index import CONTROL_FLOW_V1, CONTROL_FLOW_V2, GraphIndex, Tensor
from graphmem.graph.names import input_string
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

COPY_DIR = "graphmem_loop_recompute"
_UNSTACKABLE = frozenset({dtypes.RESOURCE, dtypes.VARIANT, dtypes.STRING})
_ALLOC_UNIT = 256  # a value this small costs a stack element whatever it holds
_KEEP, _COPY, _INVARIANT, _CANNOT = "keep", "copy", "invariant", "cannot"


@dataclass
class LoopRewrite:
    """What was done in one loop."""

    frame: str
    gradient_frame: str
    trip_count: int | None
    recomputed: list[str] = field(default_factory=list)  # values no longer stacked
    freed_bytes_per_iteration: int = 0
    new_stacks: list[str] = field(default_factory=list)  # kept values given a stack
    added_bytes_per_iteration: int = 0
    copied_ops: int = 0
    entered_invariants: int = 0
    still_stacked: dict[str, int] = field(default_factory=dict)  # why: count


@dataclass
class LoopRecomputeV1Plan(PassPlan):
    loops: list[LoopRewrite] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)  # {frame, why}

    @property
    def freed_bytes(self) -> int:
        """Bytes per step the rewritten loops no longer stack (trip count x element)."""
        return sum(lp.freed_bytes_per_iteration * (lp.trip_count or 1)
                   - lp.added_bytes_per_iteration * (lp.trip_count or 1) for lp in self.loops)

    @property
    def changed(self) -> bool:
        return bool(self.loops)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        reasons: dict[str, int] = {}
        for s in self.skipped:
            reasons[s["why"]] = reasons.get(s["why"], 0) + 1
        return reasons


def apply_loop_recompute_v1(index: GraphIndex, batch_size: int | None,
                            policy: str = "memory",
                            trip_counts: dict[str, int | None] | None = None
                            ) -> LoopRecomputeV1Plan:
    """Rewrite index.graph_def in place (the index is stale afterwards). `policy`: as the
    v2 loop pass's (speed keeps matmul outputs). `trip_counts`: frame path -> iterations,
    for the report."""
    plan = LoopRecomputeV1Plan()
    keep_matmuls = policy == "speed"
    for loop in find_v1_loops(index):
        name = loop.frame.lstrip("/")
        if loop.problem:
            plan.skipped.append({"frame": name, "why": loop.problem})
            continue
        done = _Loop(index, loop, batch_size, keep_matmuls).rewrite(
            (trip_counts or {}).get(loop.frame))
        if isinstance(done, str):
            plan.skipped.append({"frame": name, "why": done})
        else:
            plan.loops.append(done)
    return plan


class _Loop:
    """One forward frame: classify, choose, then edit."""

    def __init__(self, index: GraphIndex, loop: V1Loop, batch_size: int | None,
                 keep_matmuls: bool) -> None:
        self.ix = index
        self.loop = loop
        self.keep_matmuls = keep_matmuls
        self.sizes = index.output_bytes(batch_size)
        self.stack_of: dict[Tensor, list[Stack]] = {}
        for s in loop.stacks:
            self.stack_of.setdefault(s.value, []).append(s)
        self._kind: dict[Tensor, str] = {}
        self._node_ok: dict[int, bool] = {}

    # ---- classification ------------------------------------------------------------
    def kind(self, t: Tensor) -> str:
        k = self._kind.get(t)
        if k is None:
            k = self._kind[t] = self._classify(t)
        return k

    def _classify(self, t: Tensor) -> str:
        ix = self.ix
        i = t[0]
        op = ix.ops[i]
        if ix.frame[i] != self.loop.frame:
            return _CANNOT
        if op in ("Enter", "RefEnter"):
            return _INVARIANT if i in self.loop.invariants else _CANNOT
        dtype = ix.dtype(t)
        stackable = dtype is not None and not dtypes.is_ref(dtype) and \
            dtype not in _UNSTACKABLE
        keep = (op in CONTROL_FLOW_V1 or ix.stateful[i]
                or (op == "Identity" and ix.data_inputs[i] and
                    ix.ops[ix.data_inputs[i][0][0]] in ("Switch", "RefSwitch"))
                or any(dtypes.is_ref(ix.dtype(s) or 0) for s in ix.data_inputs[i])
                or (self.keep_matmuls and op in EXPENSIVE_OPS))
        if keep:
            return _KEEP if (t in self.stack_of or stackable) else _CANNOT
        if op in CONTROL_FLOW_V2 or op.startswith("_"):
            return _CANNOT
        if any(a.func.name or a.list.func for a in ix.node(i).attr.values()):
            return _CANNOT  # calls a function: opaque
        return _COPY

    def copyable(self, i: int) -> bool:
        """Whether node i can be copied into the gradient frame, its inputs ending in kept
        values, invariants and constants (iterative walk, memoized per loop)."""
        ix = self.ix
        stack = [i]
        while stack:
            j = stack[-1]
            if j in self._node_ok:
                stack.pop()
                continue
            pending = False
            ok = True
            for t in ix.data_inputs[j]:
                k = self.kind(t)
                if k == _CANNOT:
                    ok = False
                    break
                if k == _COPY:
                    done = self._node_ok.get(t[0])
                    if done is None:
                        stack.append(t[0])
                        pending = True
                    elif not done:
                        ok = False
                        break
            if ok and pending:
                continue
            self._node_ok[j] = ok
            stack.pop()
        return self._node_ok[i]

    # ---- choice and edit -------------------------------------------------------------
    def rewrite(self, trip: int | None) -> LoopRewrite | str:
        ix, loop = self.ix, self.loop
        result = LoopRewrite(loop.frame.lstrip("/"), loop.grad_frame.lstrip("/"), trip)
        chosen: list[Tensor] = []
        for value in self.stack_of:
            why = self._why_kept(value)
            if why:
                result.still_stacked[why] = result.still_stacked.get(why, 0) + 1
            else:
                chosen.append(value)
        if not chosen:
            return "no stacked value is recomputable"
        cone = self._cone(chosen)
        leaves_kept: set[Tensor] = set()
        leaves_inv: set[Tensor] = set()
        for i in cone:
            for t in ix.data_inputs[i]:
                k = self.kind(t)
                if k == _KEEP:
                    leaves_kept.add(t)
                elif k == _INVARIANT:
                    leaves_inv.add(t)
        new_stacks = sorted(t for t in leaves_kept if t not in self.stack_of)
        freed = sum(self._bytes(t) or 0 for t in chosen)
        added = 0
        for t in new_stacks:
            b = self._element_bytes(t)
            if b is None:
                return f"{ix.tensor_name(t)} would need a stack of unknown size"
            added += b
        if freed <= added:
            return (f"recompute would stack {added} bytes per iteration to free {freed}")
        self._edit(chosen, cone, new_stacks, leaves_inv, result)
        result.recomputed = [ix.tensor_name(t) for t in chosen]
        result.freed_bytes_per_iteration = freed
        result.added_bytes_per_iteration = added
        result.new_stacks = [ix.tensor_name(t) for t in new_stacks]
        return result

    def _why_kept(self, value: Tensor) -> str:
        k = self.kind(value)
        if k == _KEEP:
            return "kept by the policy (loop-carried, stateful, input read or matmul)"
        if k != _COPY:
            return "not recomputable (another frame, an invariant or an opaque op)"
        b = self._bytes(value)
        if b is not None and b <= _ALLOC_UNIT:
            return "too small to be worth recomputing"
        if not self.copyable(value[0]):
            return "its producers reach an op the pass cannot copy or keep"
        return ""

    def _bytes(self, t: Tensor) -> int | None:
        sizes = self.sizes(t[0])
        b = sizes[t[1]] if t[1] < len(sizes) else None
        return None if b is None else allocation_bytes(b)

    def _element_bytes(self, t: Tensor) -> int | None:
        """What a new stack holds per iteration: nothing for a variable read (it shares
        the variable's buffer)."""
        ix = self.ix
        if ix.ops[t[0]] == "ReadVariableOp" or (
                ix.ops[t[0]] == "Identity" and any(dtypes.is_ref(ix.dtype(s) or 0)
                                                   for s in ix.data_inputs[t[0]])):
            return 0
        return self._bytes(t)

    def _cone(self, chosen: list[Tensor]) -> list[int]:
        """The ops to copy, in topological order."""
        ix = self.ix
        seen: set[int] = set()
        todo = [t[0] for t in chosen]
        while todo:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            for t in ix.data_inputs[i]:
                if self.kind(t) == _COPY:
                    todo.append(t[0])
        return sorted(seen, key=lambda i: ix.position[i])

    def _edit(self, chosen, cone, new_stacks, invariants, result: LoopRewrite) -> None:
        ix, loop = self.ix, self.loop
        nodes = ix.graph_def.node
        grad_scope = loop.grad_frame_name.rsplit("/", 1)[0]
        prefix = f"{grad_scope}/{COPY_DIR}" if grad_scope else COPY_DIR
        taken = set(ix.id_of)

        def fresh(name: str) -> str:
            name = unique_name(name, taken.__contains__)
            taken.add(name)
            return name

        # the gradient frame's view of each kept value: a pop
        pop_of: dict[Tensor, str] = {t: ix.names[s[0].pop] for t, s in self.stack_of.items()}
        template = loop.stacks[0]
        for t in new_stacks:
            pop_of[t] = self._add_stack(template, t, prefix, fresh)
        # loop invariants entered into the gradient frame
        enter_of: dict[Tensor, str] = {}
        for t in sorted(invariants):
            src = ix.data_inputs[t[0]][0]
            if src in loop.grad_enters:
                enter_of[t] = ix.names[loop.grad_enters[src]]
                continue
            node = nodes.add()
            node.CopyFrom(nodes[t[0]])
            node.name = fresh(f"{prefix}/{ix.names[t[0]]}")
            node.attr["frame_name"].s = loop.grad_frame_name.encode()
            node.attr["parallel_iterations"].i = loop.grad_parallel_iterations
            enter_of[t] = node.name
            result.entered_invariants += 1
        # holds: each gradient loop variable of the iteration, as an Identity
        holds = []
        for sw in loop.grad_switches:
            node = nodes.add()
            node.name = fresh(f"{prefix}/wait/{ix.names[sw]}")
            node.op = "Identity"
            node.input.append(input_string(ix.names[sw], 1))
            node.device = ix.devices[sw]
            node.attr["T"].type = ix.out_dtypes[sw][0]
            holds.append(node.name)
        anchor = ix.names[loop.grad_anchor]
        copy_name = {i: fresh(f"{prefix}/{ix.names[i]}") for i in cone}
        in_cone = set(cone)
        for i in cone:
            node = nodes.add()
            node.CopyFrom(nodes[i])
            node.name = copy_name[i]
            del node.input[:]
            reads_leaf = False
            for t in ix.data_inputs[i]:
                k = self.kind(t)
                if k == _COPY:
                    node.input.append(input_string(copy_name[t[0]], t[1]))
                else:
                    node.input.append(pop_of[t] if k == _KEEP else enter_of[t])
                    reads_leaf = True
            for c in ix.control_inputs[i]:
                if c in in_cone:
                    node.input.append("^" + copy_name[c])
            if not ix.data_inputs[i]:
                node.input.append("^" + anchor)
            if reads_leaf:  # a pop is ready early: wait for this iteration's gradients
                node.input.extend("^" + h for h in holds)
        result.copied_ops = len(cone)
        # the readers of a recomputed value's pop read its copy; its push pushes a dummy
        dummies: dict[tuple[int, str], str] = {}
        for t in chosen:
            for s in self.stack_of[t]:
                dtype = ix.dtype(t)
                key = (dtype, ix.devices[s.push])
                if key not in dummies:
                    dummies[key] = self._add_dummy(dtype, ix.devices[s.push], fresh)
                push = nodes[s.push]
                push.input[1] = dummies[key]
                _scalar_shape(push)
                _scalar_shape(nodes[s.pop])
                for c in ix.consumers.get((s.pop, 0), ()):
                    reader = nodes[c]
                    for n, text in enumerate(reader.input):
                        if text in (ix.names[s.pop], ix.names[s.pop] + ":0"):
                            reader.input[n] = input_string(copy_name[t[0]], t[1])

    def _add_dummy(self, dtype: int, device: str, fresh) -> str:
        ix, loop = self.ix, self.loop
        name = fresh(f"{ix.names[loop.pivot]}/{COPY_DIR}_dummy_{dtypes.name(dtype)}")
        return add_scalar_const(ix.graph_def, name, dtype, None, device,  # a zero
                                [ix.names[loop.pivot]]).name

    def _add_stack(self, template: Stack, t: Tensor, prefix: str, fresh) -> str:
        """A new stack for kept value t, cloned from `template` (its counters and syncs):
        StackV2 and its size, an Enter into each frame, a push and a pop. Returns the
        pop's name."""
        ix = self.ix
        nodes = ix.graph_def.node
        dtype = ix.dtype(t)
        base = f"{prefix}/stack/{ix.names[t[0]]}"
        if t[1]:
            base += f"_{t[1]}"
        names = {}

        def clone(i: int, role: str):
            node = nodes.add()
            node.CopyFrom(nodes[i])
            node.name = names[i] = fresh(f"{base}/{role}")
            if "_class" in node.attr:
                del node.attr["_class"]
            return node

        push, pop, s = template.push, template.pop, template.stack
        size_src = ix.data_inputs[s][0][0]
        size = clone(size_src, "max_size")
        stack = clone(s, "f_acc")
        del stack.input[:]
        stack.input.append(size.name)
        stack.attr["elem_type"].type = dtype
        push_enter = ix.data_inputs[push][0][0]
        pop_enter = ix.data_inputs[pop][0][0]
        for e, role in ((push_enter, "enter"), (pop_enter, "pop_enter")):
            node = clone(e, role)
            node.input[0] = stack.name
        p = clone(push, "push")
        p.input[0] = names[push_enter]
        p.input[1] = input_string(ix.names[t[0]], t[1])
        p.attr["T"].type = dtype
        _copy_shape(ix, t, p)
        q = clone(pop, "pop")
        q.input[0] = names[pop_enter]
        q.attr["elem_type"].type = dtype
        _copy_shape(ix, t, q)
        # whatever waits for the template's push and pop (the forward counter's next
        # iteration, the gradient loop's sync) waits for these too
        for readers, new in ((ix.control_consumers[push], p.name),
                             (ix.control_consumers[pop], q.name)):
            for c in readers:
                nodes[c].input.append("^" + new)
        return q.name


def _scalar_shape(node) -> None:
    if "_output_shapes" in node.attr:
        shapes = node.attr["_output_shapes"].list.shape
        del shapes[:]
        shapes.add()


def _copy_shape(ix: GraphIndex, t: Tensor, node) -> None:
    src = ix.node(t[0])
    if "_output_shapes" in src.attr and t[1] < len(src.attr["_output_shapes"].list.shape):
        shapes = node.attr["_output_shapes"].list.shape
        del shapes[:]
        shapes.add().CopyFrom(src.attr["_output_shapes"].list.shape[t[1]])
    elif "_output_shapes" in node.attr:
        del node.attr["_output_shapes"]


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LoopRecomputeV1Pass(Pass):
    """Recompute inside control-flow-v1 loop frames: fewer stacks."""

    name, edits = "loop bodies v1", Edits.NODES

    def enabled(self, options) -> bool:
        return options.loop_body_policy() is not None

    def applies(self, context: PassContext) -> bool:
        return any(context.index.frame)

    def run(self, context: PassContext) -> LoopRecomputeV1Plan:
        batch_size = context.options.batch_size
        trips = {"/" + lp.name: lp.trip_count for lp in
                 analyze_loops(context.index, batch_size).loops if lp.kind == "v1"}
        return apply_loop_recompute_v1(context.index, batch_size,
                                       context.options.loop_body_policy(), trips)
