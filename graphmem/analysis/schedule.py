"""The order in which TensorFlow's executor runs a step's ops, approximately.

With one inter-op thread, TF's executor runs inexpensive ready ops inline, first in first
out; of the expensive ops made ready by one op, it keeps the last to run next and dispatches
the others as tasks, which the single pool thread takes last in, first out. The effect is a
depth-first walk: a backward chain runs to its end while the ops it readied on the way (weight
gradient updates, side branches) wait. Memory depends on that order, so the estimator follows
it instead of a breadth-first topological order.
"""

from __future__ import annotations

from collections import deque

from graphmem.graph.index import GraphIndex

# Kernels TF marks inexpensive, or that only forward or describe a buffer.
CHEAP_OPS = frozenset({
    "Const", "HostConst", "Identity", "IdentityN", "NoOp", "Shape", "ShapeN", "Size", "Rank",
    "Reshape", "ExpandDims", "Squeeze", "StopGradient", "Snapshot", "PreventGradient",
    "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "VarHandleOp", "VariableV2",
    "ReadVariableOp", "ControlTrigger", "Enter", "Exit", "Merge", "Switch", "NextIteration",
    "LoopCond", "RefIdentity", "ZerosLike", "OnesLike", "Fill", "BroadcastGradientArgs",
    "DynamicStitch", "Pack", "StridedSlice", "ConcatOffset", "InvertPermutation", "Range",
})
# After a few steps TF learns that ops this small are cheap too.
_SMALL_BYTES = 4096


def executor_order(index: GraphIndex, nodes: set[int] | None = None,
                   batch_size: int | None = None) -> list[int]:
    n = len(index)
    member = bytearray(n)  # 1 for ops in the step
    for i in (nodes if nodes is not None else range(n)):
        member[i] = 1
    ops, data_inputs, control_inputs = index.ops, index.data_inputs, index.control_inputs
    indeg = [0] * n
    succ: list[list[int]] = [[] for _ in range(n)]
    cheap = bytearray(n)
    sizes_of = index.output_bytes(batch_size)
    for i in index.topo:
        if not member[i]:
            continue
        loop_back = ops[i] in ("Merge", "RefMerge")
        count = 0
        for s, _ in data_inputs[i]:
            if member[s] and not (loop_back and ops[s] in _BACK_EDGE_SOURCES):
                succ[s].append(i)
                count += 1
        for s in control_inputs[i]:
            if member[s]:
                succ[s].append(i)
                count += 1
        indeg[i] = count
        if ops[i] in CHEAP_OPS:
            cheap[i] = 1
        else:
            cheap[i] = 1
            for b in sizes_of(i):
                if b is None or b > _SMALL_BYTES:
                    cheap[i] = 0
                    break
    tasks: list[int] = [i for i in reversed(index.topo) if member[i] and indeg[i] == 0]
    inline: deque[int] = deque()
    order: list[int] = []
    while tasks or inline:
        if not inline:
            inline.append(tasks.pop())
        i = inline.popleft()
        order.append(i)
        expensive = None
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j]:
                continue
            if cheap[j]:
                inline.append(j)
            else:
                if expensive is not None:
                    tasks.append(expensive)
                expensive = j
        if expensive is not None:
            if inline:
                tasks.append(expensive)
            else:
                inline.append(expensive)
    expected = sum(member)
    if len(order) != expected:  # should not happen on an indexed graph; keep every op
        seen = set(order)
        order.extend(i for i in index.topo if member[i] and i not in seen)
    return order


_BACK_EDGE_SOURCES = frozenset({"NextIteration", "RefNextIteration"})
