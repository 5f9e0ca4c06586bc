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

from graphmem.graph.index import GraphIndex, nbytes

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
    members = nodes if nodes is not None else set(range(len(index)))
    indeg: dict[int, int] = {}
    succ: dict[int, list[int]] = {}
    for i in index.topo:
        if i not in members:
            continue
        preds = _preds(index, i, members)
        indeg[i] = len(preds)
        for s in preds:
            succ.setdefault(s, []).append(i)
    cheap = {i: _is_cheap(index, i, batch_size) for i in indeg}
    tasks: list[int] = [i for i in reversed(index.topo) if indeg.get(i) == 0]
    inline: deque[int] = deque()
    order: list[int] = []
    while tasks or inline:
        if not inline:
            inline.append(tasks.pop())
        i = inline.popleft()
        order.append(i)
        expensive = None
        for j in succ.get(i, ()):
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
    if len(order) != len(indeg):  # should not happen on an indexed graph; keep every op
        seen = set(order)
        order.extend(i for i in index.topo if i in indeg and i not in seen)
    return order


def _preds(index: GraphIndex, i: int, members: set[int]) -> list[int]:
    loop_back = index.ops[i] in ("Merge", "RefMerge")
    preds = [s for s, _ in index.data_inputs[i]
             if s in members and not (loop_back and index.ops[s] in ("NextIteration",
                                                                       "RefNextIteration"))]
    preds += [s for s in index.control_inputs[i] if s in members]
    return preds


def _is_cheap(index: GraphIndex, i: int, batch_size: int | None) -> bool:
    if index.ops[i] in CHEAP_OPS:
        return True
    largest = 0
    for k in range(index.num_outputs[i]):
        b = nbytes(index.shape((i, k)), index.dtype((i, k)), batch_size)
        if b is None:
            return False
        largest = max(largest, b)
    return largest <= _SMALL_BYTES
