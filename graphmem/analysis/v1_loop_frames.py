"""The parts of a control-flow-v1 while loop and its gradient loop that a rewrite inside
them needs: the two frames, their pivots, the stacks that carry forward values to the
gradient loop, and what makes a loop unsafe to edit.

TF's gradient machinery (control_flow_state.py: `GradLoopState.AddForwardAccumulator`,
`AddBackpropAccumulatedValue`) gives each forward value the gradient loop reads one stack:
`StackV2` outside the frames, `Enter`ed into both, a `StackPushV2` in the forward frame (run
every iteration: the forward loop's history counter waits for it) and a `StackPopV2` in the
gradient frame (waiting for the gradient loop's counter, and joined by its sync op). Pops
run in reverse order of the pushes, so in one gradient iteration every pop hands back the
values of one and the same forward iteration.

Facts only; found in one pass over the graph (nodes grouped by frame once).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.graph import dtypes
from graphmem.graph.index import CONTROL_FLOW_V1, GraphIndex, Tensor, attr_of

_ENTER = ("Enter", "RefEnter")
_SWITCH = ("Switch", "RefSwitch")
_MERGE = ("Merge", "RefMerge")
_NEXT = ("NextIteration", "RefNextIteration")


@dataclass
class Stack:
    """One accumulator: a value pushed once per forward iteration, popped once per gradient
    iteration."""

    stack: int  # StackV2
    push: int  # StackPushV2 in the forward frame
    pop: int  # StackPopV2 in the gradient frame
    value: Tensor  # the pushed forward tensor


@dataclass
class V1Loop:
    """A forward v1 loop frame and what a rewrite of it needs to know."""

    frame: str  # index.frame path of the forward frame ("/rnn/while/while_context")
    grad_frame: str = ""  # same for its gradient loop; "" when it has none
    grad_frame_name: str = ""  # the gradient frame's `frame_name` attribute
    grad_parallel_iterations: int = 10
    pivot: int | None = None  # an Identity of a loop variable in the forward frame
    grad_anchor: int | None = None  # a node run once per gradient iteration
    stacks: list[Stack] = field(default_factory=list)
    # forward Enter ops with is_constant (loop invariants): Enter id -> entered tensor
    invariants: dict[int, Tensor] = field(default_factory=dict)
    # constant Enters of the gradient frame: entered tensor -> Enter id (to reuse)
    grad_enters: dict[Tensor, int] = field(default_factory=dict)
    # Switch ops of the gradient loop's floating-point loop variables (the gradients it
    # carries from one iteration to the next)
    grad_switches: list[int] = field(default_factory=list)
    problem: str = ""  # why the loop must be left as it is ("" when it can be edited)


_FLOAT_TYPES = dtypes.FLOATS


def find_v1_loops(index: GraphIndex) -> list[V1Loop]:
    """Every forward loop frame that pushes values for a gradient loop, with its facts, or
    with `problem` set when a rewrite inside it is not safe (nested frames, conditionals in
    the body, stacks of unexpected shape, pops spread over several frames)."""
    frame, ops, ins = index.frame, index.ops, index.data_inputs
    if not any(frame):
        return []
    members: dict[str, list[int]] = {}
    for i in index.topo:
        if frame[i]:
            members.setdefault(frame[i], []).append(i)
    parent: dict[str, str] = {}
    for f, nodes in members.items():
        for i in nodes:
            if ops[i] in _ENTER and ins[i]:
                parent.setdefault(f, frame[ins[i][0][0]])
    has_child = {p for p in parent.values() if p}
    stacks = _stacks(index)
    by_push_frame: dict[str, list[Stack]] = {}
    for s in stacks:
        by_push_frame.setdefault(frame[s.push], []).append(s)
    loops = []
    for f, found in by_push_frame.items():
        loop = V1Loop(f, stacks=found)
        loops.append(loop)
        grad_frames = {frame[s.pop] for s in found}
        if parent.get(f):
            loop.problem = "the loop runs inside another loop"
        elif f in has_child:
            loop.problem = "the loop body holds a nested loop"
        elif len(grad_frames) != 1:
            loop.problem = "its values are popped in several frames"
        if loop.problem:
            continue
        loop.grad_frame = grad_frames.pop()
        if parent.get(loop.grad_frame) or loop.grad_frame in has_child:
            loop.problem = "the gradient loop is nested"
            continue
        loop.problem = _describe_forward(index, loop, members.get(f, [])) or \
            _describe_gradient(index, loop, members.get(loop.grad_frame, []))
    return loops


def _stacks(index: GraphIndex) -> list[Stack]:
    """Stacks with exactly one push (in a frame) and one pop (in a frame), each reading
    the stack's handle through one Enter."""
    ops, ins, frame = index.ops, index.data_inputs, index.frame
    pushes: dict[int, list[int]] = {}
    pops: dict[int, list[int]] = {}
    for i in range(len(index)):
        op = ops[i]
        if op in ("StackPushV2", "StackPopV2") and ins[i] and frame[i]:
            e = ins[i][0][0]
            if ops[e] in _ENTER and ins[e] and ops[ins[e][0][0]] == "StackV2":
                (pushes if op == "StackPushV2" else pops).setdefault(ins[e][0][0], []).append(i)
    found = []
    for s, ps in pushes.items():
        qs = pops.get(s, [])
        if len(ps) == 1 and len(qs) == 1 and len(ins[ps[0]]) == 2:
            found.append(Stack(s, ps[0], qs[0], ins[ps[0]][1]))
    return found


def _describe_forward(index: GraphIndex, loop: V1Loop, nodes: list[int]) -> str:
    ops, ins = index.ops, index.data_inputs
    cond = [i for i in nodes if ops[i] == "LoopCond"]
    if len(cond) != 1:
        return "the forward frame has no single LoopCond"
    for i in nodes:
        op = ops[i]
        if op in _SWITCH and (len(ins[i]) != 2 or ins[i][1][0] != cond[0]):
            return f"a conditional in the loop body ({index.names[i]})"
        if op in _MERGE and not all(ops[s] in _ENTER or ops[s] in _NEXT for s, _ in ins[i]):
            return f"a conditional in the loop body ({index.names[i]})"
        if op in _ENTER:
            node = index.node(i)
            if attr_of(node, "is_constant").b and ins[i]:
                loop.invariants[i] = ins[i][0]
        if op == "Identity" and loop.pivot is None and ins[i] and ops[ins[i][0][0]] in _SWITCH \
                and ins[i][0][1] == 1:
            loop.pivot = i
    if loop.pivot is None:
        return "no loop variable to anchor new constants on"
    for s in loop.stacks:
        if index.frame[s.value[0]] != loop.frame:
            return f"{index.names[s.push]} pushes a value from another frame"
    return ""


def _describe_gradient(index: GraphIndex, loop: V1Loop, nodes: list[int]) -> str:
    ops, ins = index.ops, index.data_inputs
    cond = [i for i in nodes if ops[i] == "LoopCond"]
    if len(cond) != 1:
        return "the gradient frame has no single LoopCond"
    for i in nodes:
        op = ops[i]
        if op in _ENTER:
            node = index.node(i)
            if not loop.grad_frame_name:
                loop.grad_frame_name = attr_of(node, "frame_name").s.decode("utf-8",
                                                                           "replace")
                loop.grad_parallel_iterations = attr_of(node, "parallel_iterations").i or 10
            if attr_of(node, "is_constant").b and ins[i]:
                loop.grad_enters.setdefault(ins[i][0], i)
        elif op in _SWITCH and len(ins[i]) == 2 and ins[i][1][0] == cond[0]:
            types = index.out_dtypes[i]
            if types and types[0] in _FLOAT_TYPES:
                loop.grad_switches.append(i)
    pop = loop.stacks[0].pop
    anchors = [c for c in index.control_inputs[pop] if index.frame[c] == loop.grad_frame
               and ops[c] not in CONTROL_FLOW_V1]
    if not anchors:
        return "the gradient loop's pops wait for no counter"
    loop.grad_anchor = anchors[0]
    return ""
