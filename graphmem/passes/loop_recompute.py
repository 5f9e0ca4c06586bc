"""Recompute inside control-flow-v2 loops: accumulate fewer values, rebuild the rest.

For each forward intermediate its gradient needs, TF's while_v2 gives the forward `While` a
tensor list (an `EmptyTensorList` made outside, `TensorListPushBack` in the body every
iteration); the gradient `While` pops one element per iteration, last first. An LSTM keeps
about ten [batch, units] values per step so; its cell needs only h, c and the step's input
to rebuild them all. This pass, per forward/gradient loop pair:

1. asks `analysis/body_recompute.py` which accumulated values are rebuilt from which kept
   values (loop-carried inputs, list reads, stateful outputs, with the speed policy matmul
   outputs) of the same iteration;
2. stops accumulating each rebuilt value: its list now receives a scalar constant (a shared
   buffer, no bytes per step) or, when a rebuild reads a kept value no list holds (the bias
   read of an LSTM), that value; the list's `element_shape` becomes "unknown" (its own
   Const of -1) because `TensorListPushBack` checks the element against it. `PopBack`
   only checks an element that is missing. Signatures, loop variables and the condition
   stay as they were;
3. copies the rebuilding ops into the gradient body, reading the pops of the kept values,
   and points the readers of each rebuilt value's pop at the copy. All lists are popped
   once per gradient iteration, so the pops of one iteration are the values of one forward
   iteration, and every copy computes from the same step as the original.

Loops it cannot read (body shared by several ops, lists that feed more than one gradient
loop, a gradient body that does not pop a list exactly once) are left whole and named with
the reason. Values it cannot rebuild (stateful ops such as dropout, nested loops, `If`,
handles) stay accumulated.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem.analysis.body_recompute import BodyRecompute, plan_body_recompute
from graphmem.analysis.loops import (
    StaticValues,
    allocation_bytes,
    holding_pays,
    list_element_bytes,
    running_sums,
)
from graphmem.analysis.op_classes import EXPENSIVE_OPS
from graphmem.graph import dtypes
from graphmem.graph.builders import add_scalar_const, unique_name
from graphmem.graph.dtypes import FLOATS
from graphmem.graph.function_view import ARG_OP, RETVAL_OP, FunctionView, functions_named
from graphmem.graph.index import V2_LOOP_OPS, GraphIndex, Tensor
from graphmem.graph.names import input_string, parse_input
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

SCOPE = "graphmem_loop_recompute"
_ACCUMULATE = "TensorListPushBack"
_POP = "TensorListPopBack"


@dataclass
class LoopRecomputeFact:
    """What was done in one loop."""

    loop: str  # the forward While
    gradient_loop: str
    accumulated_before: int
    rebuilt: list[str]  # values no longer accumulated (forward body tensor names)
    kept: dict[str, str]  # value -> why it is still accumulated
    now_accumulated: list[str]  # kept values a list now holds in place of a rebuilt one
    copied_ops: int  # ops copied into the gradient body
    bytes_saved_per_iteration: int | None  # None when an element's size is unknown
    sums_held_back: int = 0  # gradient addends made to wait for their running sum


@dataclass
class LoopRecomputePlan(PassPlan):
    policy: str = "memory"
    loops: list[LoopRecomputeFact] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # loop -> why left whole
    edited_functions: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.loops)

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(Counter(self.skipped.values()))


def apply_loop_recompute(index: GraphIndex, library: Message, policy: str = "memory",
                         batch_size: int | None = None, outer_function: str | None = None,
                         backup: dict[str, bytes] | None = None) -> LoopRecomputePlan:
    """Edit `index.graph_def` (appending nodes, editing inputs) and the loop functions of
    `library` in place. `outer_function`: the library function `index` views (a TF2 train
    step), so its own references are not counted twice. `backup` receives each edited
    function's bytes before the edit (for undoing a rewrite whose graph is a view)."""
    plan = LoopRecomputePlan(policy)
    if not V2_LOOP_OPS & set(index.ops):  # most graphs: one scan in C
        return plan
    whiles = [i for i in range(len(index)) if index.ops[i] in V2_LOOP_OPS and not index.in_loop(i)]
    if not whiles:
        return plan
    functions = {f.signature.name: f for f in library.function}
    refs = _references(index, library, outer_function)
    keep_ops = EXPENSIVE_OPS if policy == "speed" else frozenset()
    for w in whiles:
        why = _one_loop(index, w, functions, refs, keep_ops, batch_size, plan, backup)
        if why is not None:
            plan.skipped[index.names[w]] = why
    return plan


def _references(index: GraphIndex, library: Message, outer: str | None) -> Counter:
    """How many nodes name each function (the outer graph's and every function's)."""
    names = {f.signature.name for f in library.function}
    refs: Counter = Counter()
    for i in range(len(index)):
        node = index.node(i)
        refs.update(functions_named(node))
        if node.op in names:
            refs[node.op] += 1
    for f in library.function:
        if f.signature.name == outer:
            continue
        for node in f.node_def:
            refs.update(functions_named(node))
            if node.op in names:
                refs[node.op] += 1
    return refs


@dataclass
class _List:
    """One accumulator: forward output j, gradient input k, its push and its pop."""

    j: int
    k: int
    push: int  # in the forward body
    pop: int  # in the gradient body
    value: Tensor  # the pushed tensor (forward body)
    dtype: int
    source: int  # the EmptyTensorList in the outer graph
    list_bytes: int | None = None  # element bytes from the list's own element shape


def _one_loop(index, w, functions, refs, keep_ops, batch_size, plan, backup) -> str | None:
    node = index.node(w)
    body_name = node.attr["body"].func.name
    if body_name not in functions:
        return "body function not in the library"
    # the lists: forward outputs that go from a push in the body to one gradient loop
    grads = set()
    candidates = []
    for j, t in enumerate(index.data_inputs[w]):
        src = index.through_identity(t[0])
        if index.ops[src] != "EmptyTensorList":
            continue
        readers = index.consumers.get((w, j), [])
        if len(readers) != 1 or index.ops[readers[0]] not in V2_LOOP_OPS:
            continue
        g = readers[0]
        ks = [k for k, s in enumerate(index.data_inputs[g]) if s == (w, j)]
        if len(ks) != 1:
            continue
        grads.add(g)
        candidates.append((j, ks[0], src))
    if not candidates:
        return "no tensor lists for a gradient loop"
    if len(grads) != 1:
        return "its lists feed more than one loop"
    g = grads.pop()
    grad_name = index.node(g).attr["body"].func.name
    if grad_name not in functions:
        return "gradient body not in the library"
    if refs[body_name] != 1 or refs[grad_name] != 1:
        return "a loop function is used by more than one op"
    if grad_name in plan.edited_functions:
        return "its gradient body was edited for another loop"
    try:
        fview = FunctionView.build(functions[body_name], index.registry)
        gview = FunctionView.build(functions[grad_name], index.registry)
    except Exception as exc:  # noqa: BLE001 - a body graphmem cannot read is left alone
        return f"cannot read the loop functions ({exc})"
    fix = GraphIndex.build(fview.graph_def, index.registry)
    gix = GraphIndex.build(gview.graph_def, index.registry)
    f_args, f_rets = _args_rets(fix)
    f_retvals = _retval_nodes(fix)
    g_args, g_rets = _args_rets(gix)
    lists: list[_List] = []
    statics = StaticValues(index, batch_size)
    for j, k, src in candidates:
        push = f_rets.get(j)
        if push is None or fix.ops[push[0]] != _ACCUMULATE or push[1] != 0:
            continue
        ins = fix.data_inputs[push[0]]
        if len(ins) != 2 or ins[0] != (f_args.get(j), 0) or \
                fix.consumers.get(push, []) != [f_retvals[j]]:
            continue
        if len(fix.consumers.get((f_args[j], 0), [])) != 1:
            continue
        arg = g_args.get(k)
        pops = gix.consumers.get((arg, 0), []) if arg is not None else []
        if len(pops) != 1 or gix.ops[pops[0]] != _POP or g_rets.get(k) != (pops[0], 0) \
                or gix.control_inputs[pops[0]] or gix.data_inputs[pops[0]][0] != (arg, 0):
            continue
        dtype = fix.node(push[0]).attr["element_dtype"].type
        lists.append(_List(j, k, push[0], pops[0], ins[1], dtype, src,
                           list_element_bytes(index, index.data_inputs[w][j], statics)))
    if not lists:
        return "no list is pushed in its body and popped in its gradient"
    values = [lst.value for lst in lists]
    forced: dict[Tensor, str] = {}
    while True:  # each round keeps the values whose rebuild needs a source no list can hold
        verdict = plan_body_recompute(fix, values, keep_ops, batch_size, forced=forced)
        more = _unprovided(fix, lists, verdict, batch_size)
        if not more:
            break
        forced.update(more)
    chosen = _choose(fix, lists, verdict, batch_size)
    if chosen is None and verdict.rebuilt:
        return ("nothing to rebuild: the kept values the rebuilds would read cost as much "
                "per iteration as they free")
    if chosen is None:
        return "nothing to rebuild: every accumulated value is kept " + \
            _reasons(fix, verdict)
    rebuilt, retarget, saved = chosen
    if backup is not None:
        for name in (body_name, grad_name):
            backup.setdefault(name, functions[name].SerializeToString())
    copied, held = _edit(index, fix, gix, fview.graph_def, gview.graph_def, lists, verdict,
                         rebuilt, retarget, batch_size)
    fview.write_back()
    gview.write_back()
    plan.edited_functions += [body_name, grad_name]
    rebuilt_names = sorted({fix.tensor_name(lst.value) for lst in lists if lst.j in rebuilt})
    plan.loops.append(LoopRecomputeFact(
        index.names[w], index.names[g], len(lists), rebuilt_names,
        {fix.tensor_name(v): why for v, why in verdict.kept.items()},
        [fix.tensor_name(v) for v in retarget.values()], copied, saved, held))
    return None


def _retval_nodes(ix: GraphIndex) -> list[int]:
    """The `_Retval` nodes of a function view, in output order."""
    return [i for i in range(len(ix)) if ix.ops[i] == RETVAL_OP]


def _args_rets(ix: GraphIndex) -> tuple[dict[int, int], dict[int, Tensor]]:
    """Argument position -> `_Arg` node; output position -> the tensor returned."""
    args = {ix.node(i).attr["index"].i: i for i in range(len(ix)) if ix.ops[i] == ARG_OP}
    rets = {k: ix.data_inputs[i][0] for k, i in enumerate(_retval_nodes(ix))
            if ix.data_inputs[i]}
    return args, rets


def _reasons(ix: GraphIndex, verdict: BodyRecompute) -> str:
    why = Counter(r.split(" (")[0] for r in verdict.kept.values())
    return "(" + ", ".join(f"{n} {r}" for r, n in why.most_common()) + ")"


def _free_bytes(ix: GraphIndex, t: Tensor, batch_size: int | None,
                fallback: int | None = None) -> int | None:
    """Bytes one more element of t costs in a list: 0 for values that share a buffer kept
    anyway (variable reads, constants, loop invariants); `fallback` when the body does not
    know t's shape."""
    op = ix.ops[t[0]]
    if op in ("ReadVariableOp", "Const", "HostConst"):
        return 0
    if op == ARG_OP:
        k = ix.node(t[0]).attr["index"].i
        rets = _args_rets(ix)[1]
        if rets.get(k) == t:
            return 0  # passed through unchanged: the same buffer every iteration
    b = ix.output_bytes(batch_size)(t[0])
    nb = b[t[1]] if t[1] < len(b) and b[t[1]] is not None else fallback
    return allocation_bytes(nb) if nb is not None else None


def _assign(fix, lists: list[_List], verdict: BodyRecompute, batch_size: int | None):
    """Give each source of a rebuild that no kept list holds a list being freed, of its
    dtype. A source of unknown size is given none (the estimate could not size the list
    it would fill). Returns (assignments j -> source, the first source left without a
    list)."""
    held = {lst.value for lst in lists if lst.value not in verdict.rebuilt}
    free: dict[int, list[int]] = {}
    needed: list[Tensor] = []
    for lst in lists:
        if lst.value in verdict.rebuilt:
            free.setdefault(lst.dtype, []).append(lst.j)
            for s in verdict.rebuilt[lst.value].sources:
                if s not in held and s not in needed:
                    needed.append(s)
    retarget: dict[int, Tensor] = {}
    for s in needed:
        slots = free.get(fix.dtype(s) or -1)
        if not slots or _free_bytes(fix, s, batch_size) is None:
            return retarget, s
        retarget[slots.pop(0)] = s
    return retarget, None


def _unprovided(fix, lists: list[_List], verdict: BodyRecompute,
                batch_size: int | None) -> dict[Tensor, str]:
    """Rebuilt values that must stay accumulated: they read a source no list can hold."""
    _, missing = _assign(fix, lists, verdict, batch_size)
    if missing is None:
        return {}
    why = (f"reads {fix.tensor_name(missing)}, which no freed list of its type can hold "
           "(or of unknown size)")
    return {v: why for v, r in verdict.rebuilt.items() if missing in r.sources}


def _choose(fix, lists: list[_List], verdict: BodyRecompute, batch_size):
    """Which lists stop holding their value (`rebuilt`: list positions j), which of them
    take a kept value no list holds (`retarget`: j -> value), and the bytes saved per
    iteration. None when nothing is saved."""
    rebuilt = {lst.j for lst in lists if lst.value in verdict.rebuilt}
    if not rebuilt:
        return None
    retarget, _ = _assign(fix, lists, verdict, batch_size)
    saved: int | None = 0
    for lst in lists:
        if lst.j in rebuilt:
            b = _free_bytes(fix, lst.value, batch_size, lst.list_bytes)
            saved = None if b is None or saved is None else saved + b
    for s in retarget.values():
        b = _free_bytes(fix, s, batch_size)
        saved = None if b is None or saved is None else saved - b
    if saved is not None and saved <= 0:
        return None
    return rebuilt, retarget, saved


def _edit(index, fix, gix, fgraph, ggraph, lists, verdict, rebuilt,
          retarget, batch_size) -> tuple[int, int]:
    """Write the plan: dummy or retargeted pushes, relaxed list shapes, copies and rewired
    readers in the gradient body. Returns the ops copied and the addends held back."""
    by_j = {lst.j: lst for lst in lists}
    # forward body: what each changed list now receives
    dummies: dict[int, str] = {}
    for j in sorted(rebuilt):
        lst = by_j[j]
        if j in retarget:
            new = input_string(fix.names[retarget[j][0]], retarget[j][1])
        else:
            if lst.dtype not in dummies:
                dummies[lst.dtype] = _unique(fgraph, fix, f"{SCOPE}/dummy_{lst.dtype}")
                add_scalar_const(fgraph, dummies[lst.dtype], lst.dtype)
            new = dummies[lst.dtype]
        fgraph.node[lst.push].input[1] = new
    # outer graph: the list's element shape becomes unknown (its own Const)
    for j in sorted(rebuilt):
        src = by_j[j].source
        etl = index.node(src)
        shape_type = etl.attr["shape_type"].type if "shape_type" in etl.attr else 3
        name = _unique(index.graph_def, index, f"{index.names[src]}/{SCOPE}_any_shape")
        const = add_scalar_const(index.graph_def, name, shape_type, -1)
        if etl.device:
            const.device = etl.device
        etl.input[0] = name
    # gradient body: a source is read from its list's pop
    pop_of: dict[Tensor, str] = {}
    for lst in lists:
        if lst.j not in rebuilt:
            pop_of.setdefault(lst.value, input_string(gix.names[lst.pop], 1))
    for j, s in retarget.items():
        pop_of[s] = input_string(gix.names[by_j[j].pop], 1)
    values = [by_j[j].value for j in sorted(rebuilt)]
    order = verdict.copy_order(fix, values)
    copy_name: dict[int, str] = {}
    copy_pos: dict[int, int] = {}
    taken = set(gix.names)
    for i in order:
        src_node = fix.node(i)
        name = f"{SCOPE}/{src_node.name}"
        while name in taken:
            name += "_"
        taken.add(name)
        copy_name[i] = name
        new = ggraph.node.add()
        copy_pos[i] = len(ggraph.node) - 1
        new.CopyFrom(src_node)
        new.name = name
        if "_class" in new.attr:
            del new.attr["_class"]
        del new.input[:]
        for s in fix.data_inputs[i]:
            new.input.append(pop_of[s] if s in pop_of else input_string(copy_name[s[0]], s[1]))
    # the gradient loop runs iterations ahead (parallel_iterations) as soon as their pops
    # are done; copies reading only pops would run ahead too and hold many steps' values
    # at once. They wait for the gradient carried in from the previous iteration.
    readers = [r for j in rebuilt for r in gix.consumers.get((by_j[j].pop, 1), [])]
    triggers = _gradient_args(gix, readers)
    copies = set(copy_name)
    for i in order:
        if fix.ops[i] in ("Const", "HostConst") or any(s[0] in copies and fix.ops[s[0]] not in (
                "Const", "HostConst") for s in fix.data_inputs[i]):
            continue
        ggraph.node[copy_pos[i]].input.extend(
            "^" + gix.names[a] for a in triggers)
    held = _hold_running_sums(gix, ggraph, batch_size)
    # readers of each rebuilt value's pop read the copy instead
    any_shape = None
    for j in sorted(rebuilt):
        lst = by_j[j]
        v = lst.value
        target = input_string(copy_name[v[0]], v[1])
        for reader in gix.consumers.get((lst.pop, 1), []):
            rnode = ggraph.node[reader]
            for p, text in enumerate(rnode.input):
                name, k, ctrl = parse_input(text)
                if not ctrl and name == gix.names[lst.pop] and k == 1:
                    rnode.input[p] = target
        if any_shape is None:
            any_shape = _unique(ggraph, gix, f"{SCOPE}/any_shape")
            add_scalar_const(ggraph, any_shape, dtypes.INT32, -1)
        pop = ggraph.node[lst.pop]
        if len(pop.input) > 1:
            pop.input[1] = any_shape
        # TF2 imports a function with its `_output_shapes` as shape facts: the popped
        # element is now the dummy (a scalar) or the retargeted value
        shapes = pop.attr["_output_shapes"].list.shape if "_output_shapes" in pop.attr \
            else None
        if shapes is not None and len(shapes) > 1:
            shapes[1].Clear()
            if j in retarget:
                known = _shape_attr(fix.node(retarget[j][0]), retarget[j][1])
                if known is None:
                    shapes[1].unknown_rank = True
                else:
                    shapes[1].CopyFrom(known)
    return len(order), held




def _hold_running_sums(gix: GraphIndex, ggraph: Message, batch_size: int | None) -> int:
    """A weight's gradient is summed over the iterations in a loop variable (`AddN(sum_in,
    addend)` returned as `sum_out`). Iterations run ahead of the sum, and each one's addend
    (an LSTM kernel's gradient, [inputs + units, 4 units]) waits for it: on one inter-op
    thread, up to `parallel_iterations` of them at once. The addend's op waits for the
    incoming sum instead, so one addend at a time exists, where that holds fewer bytes
    than the inputs the waiting op keeps in each iteration ahead (`holding_pays`).
    Returns the ops held back."""
    args, rets = _args_rets(gix)
    sizes = gix.output_bytes(batch_size)
    held = 0
    for found in running_sums(gix, args, rets):
        for p, j in found.terms:
            if found.waits(gix, p) or not holding_pays(gix, (p, j), sizes):
                continue
            ggraph.node[p].input.append("^" + gix.names[found.arg])
            held += 1
    return held


def _shape_attr(node: Message, k: int) -> Message | None:
    """Output k's `_output_shapes` entry of a node, None when absent."""
    if "_output_shapes" not in node.attr:
        return None
    shapes = node.attr["_output_shapes"].list.shape
    return shapes[k] if k < len(shapes) else None




def _gradient_args(gix: GraphIndex, readers: list[int]) -> list[int]:
    """Loop-carried floating arguments of the gradient body that the readers of the
    rebuilt values depend on: the gradient flowing from one iteration to the next."""
    _, rets = _args_rets(gix)
    found = []
    for i in sorted(gix.ancestors(readers, data_only=True)):
        if gix.ops[i] != ARG_OP or gix.dtype((i, 0)) not in FLOATS:
            continue
        k = gix.node(i).attr["index"].i
        if rets.get(k) is not None and rets[k] != (i, 0):
            found.append(i)
    return found


def _unique(graph: Message, ix: GraphIndex, name: str) -> str:
    """A name free in `graph`: neither indexed in `ix` nor among the nodes added since."""
    existing = {n.name for n in graph.node[len(ix):]}
    return unique_name(name, lambda n: n in ix.id_of or n in existing)


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LoopRecomputePass(Pass):
    """Fewer tensor-list accumulators in v2 loops: values rebuilt in the gradient body."""

    name, edits = "loop bodies", Edits.NODES  # and the loop functions of the library

    def enabled(self, options) -> bool:
        return options.loop_body_policy() is not None

    def run(self, context: PassContext) -> LoopRecomputePlan:
        ws = context.ws
        return apply_loop_recompute(context.index, ws.model.graph_def.library,
                                    context.options.loop_body_policy(),
                                    context.options.batch_size, ws.model.function_name,
                                    ws.function_backup)
