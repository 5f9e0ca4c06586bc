"""Which v2 loops may be run a second time, in the backward pass, with the same results.

A v2 loop is one op (`While`, `StatelessWhile`) whose condition and body are functions of
the graph's library. The gradient of a loop reads what the forward loop accumulated, step by
step, in tensor lists (outputs of the forward loop op): these are the loop's saved
activations, often the largest of a recurrent model. Running a copy of the loop op just
before the gradient loop rebuilds them, so the forward loop's own lists are freed as soon as
it ends (`rewrite --recompute-loops`).

A copy yields the same values when nothing in the loop's functions (nested ones included)
has state beyond reading variables: random ops with state, variable writes, queues, prints
rule a loop out. Variable reads see the same values as in the forward pass, because the copy
feeds the gradient that the optimizer's writes wait for.
"""

from __future__ import annotations

from google.protobuf.message import Message

from graphmem.graph.function_view import functions_named
from graphmem.graph.index import FUNCTION_CALLS, V2_LOOP_OPS, GraphIndex

# stateful in the op registry, but only read state (or call functions judged on their own)
_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
                    "VarIsInitializedOp"})


def replayable_loops(index: GraphIndex, library: dict[str, Message]) -> set[int]:
    """Loop ops of the graph (outside any v1 frame) whose copy yields the same outputs."""
    loops = [i for i in range(len(index)) if index.ops[i] in V2_LOOP_OPS and not index.in_loop(i)]
    if not loops:
        return set()
    impure = _impure_functions(index, library)
    found = set()
    for i in loops:
        called = functions_named(index.node(i))
        if called and all(f in library and f not in impure for f in called):
            found.add(i)
    return found


def _impure_functions(index: GraphIndex, library: dict[str, Message]) -> set[str]:
    """Functions with state beyond variable reads, directly or through the functions they
    call (a fixed point over the call graph, linear in its size)."""
    callers: dict[str, list[str]] = {}
    impure: list[str] = []
    for name, fdef in library.items():
        bad = False
        for node in fdef.node_def:
            for callee in functions_named(node) | ({node.op} if node.op in library else set()):
                callers.setdefault(callee, []).append(name)
                bad = bad or callee not in library  # nothing known about it
            if node.op in library or node.op in FUNCTION_CALLS or node.op in _READS:
                continue
            if index.registry.is_stateful(node.op):
                bad = True
        if bad:
            impure.append(name)
    seen = set(impure)
    while impure:
        for caller in callers.get(impure.pop(), ()):
            if caller not in seen:
                seen.add(caller)
                impure.append(caller)
    return seen
