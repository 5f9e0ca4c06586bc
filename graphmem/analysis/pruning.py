"""Ops of a step that TensorFlow never computes: Grappler's dependency optimizer turns an op
whose outputs no running op reads into a NoOp (it then only orders its control consumers).

The typical case is tf.gradients' gradient for an input that needs none (a constant): the
gradient of `x * c` with respect to `c` (`Mul`, `Sum`, `Reshape`) is built, grouped with the
useful gradient by a `tuple`'s `group_deps` NoOp through a control edge, and read by nothing.
On the graph as written the estimate would run it and hold its inputs (`x`, saved for the
backward pass) until then; TF does neither (traced: Grappler's graph of the transformer
fixture has no `Gelu/mul_1_grad/Mul_1`, and the GELU's `Neg` is not held for it). Linear: one
walk over data inputs from the ops that certainly run.
"""

from __future__ import annotations

from collections.abc import Iterable

from graphmem.graph import dtypes
from graphmem.graph.index import CONTROL_FLOW_V1, CONTROL_FLOW_V2, GraphIndex

# the attribute that makes Grappler keep an op its pruner and dependency optimizer would
# remove (the swap pass's copies, the recompute pass's holding Identity ops)
KEEP_ATTR = "_grappler_do_not_remove"

# never turned into NoOps (Grappler's dependency optimizer leaves them, or TF feeds them)
_KEPT_OPS = frozenset({"NoOp", "Assert", "CheckNumerics", "_Retval", "_Arg", "ControlTrigger",
                       "Placeholder", "PlaceholderWithDefault", "PrintV2", "Print"})


def unread_ops(index: GraphIndex, nodes: set[int], fetches: Iterable[int]) -> set[int]:
    """The ops of `nodes` whose outputs no op that runs reads, directly or through other
    such ops. Ops that run: the `fetches`, stateful ops, ops without outputs (updates,
    NoOps, the train op), ops that write a reference variable, control flow and loop
    bodies, and what they read."""
    ops, stateful, num_outputs, frame = index.ops, index.stateful, index.num_outputs, \
        index.frame
    needed: set[int] = set()
    stack: list[int] = []
    for i in fetches:
        if i in nodes and i not in needed:
            needed.add(i)
            stack.append(i)
    kept_types = {op for op in set(ops) if op in _KEPT_OPS or op in CONTROL_FLOW_V1
                  or op in CONTROL_FLOW_V2}
    reads_ref = _ref_readers(index)
    for i in nodes:
        if i in needed:
            continue
        if stateful[i] or not num_outputs[i] or ops[i] in kept_types or frame[i] or \
                i in reads_ref:
            needed.add(i)
            stack.append(i)
    while True:
        while stack:
            i = stack.pop()
            for s, _ in index.data_inputs[i]:
                if s in nodes and s not in needed:
                    needed.add(s)
                    stack.append(s)
        # nodes marked to be kept (swap copies: `_grappler_do_not_remove`): rare, so only
        # the candidates are looked at
        kept = [i for i in nodes if i not in needed and kept_by_grappler(index, i)]
        if not kept:
            break
        needed.update(kept)
        stack.extend(kept)
    return nodes - needed


def kept_by_grappler(index: GraphIndex, i: int) -> bool:
    """Whether op i carries KEEP_ATTR: Grappler leaves it where it would remove it."""
    attr = index.node(i).attr
    return KEEP_ATTR in attr and attr[KEEP_ATTR].b


def _ref_readers(index: GraphIndex) -> set[int]:
    """Ops taking a reference input (Assign, ApplyMomentum, a TF1 variable's updates) have
    side effects without being marked stateful: Grappler keeps them. Found from the
    reference outputs (few: TF1 variables) to their readers, not by asking every input."""
    out: set[int] = set()
    consumers = index.consumers
    ref_lists: dict[int, list[int]] = {}  # dtype lists are shared: ask each one once
    for i, types in enumerate(index.out_dtypes):
        if not types:
            continue
        refs = ref_lists.get(id(types))
        if refs is None:
            refs = ref_lists[id(types)] = [k for k, d in enumerate(types)
                                           if d is not None and dtypes.is_ref(d)]
        for k in refs:
            out.update(consumers.get((i, k), ()))
    return out
