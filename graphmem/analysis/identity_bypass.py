"""The multi-input `IdentityN` ops Grappler removes before a step runs.

Grappler's dependency optimizer bypasses an `IdentityN`: each reader of output k reads input
k itself, so no reader waits for the other inputs any more. The estimate simulates the step
TensorFlow runs, so it must not keep a barrier Grappler removed: traced on Keras' VGG16 as a
TF2 train step (SGD with momentum), Grappler's graph has no `sgd/IdentityN`, each update
reads its filter gradient directly, and the measured peak held no weight gradient, while a
simulation with the barrier held every one of them to the end of the backward pass (137 MiB
estimated against 66 MiB measured at step 3, 102 MiB the highest of 440 steps).

The conditions are the optimizer's own (`SafeToRemoveIdentity`, `BypassingNodeIsBeneficial`
in TensorFlow's dependency_optimizer.cc), for the graphs graphmem reads, whose fetches are
known (a session's, a function's results): the first input is not a variable or a receive,
no reader is a function result or a `Merge`, bypassing adds no edges (control inputs and
control readers each cost one edge per node on the other side; a reader of two outputs
counts twice; a control input the data inputs already depend on, or one from a constant,
is removed first), and it crosses no device boundary. Anything else keeps the barrier, which
can only make the estimate higher. Linear: the control readers of the candidates are found
in one walk over the control inputs, only when there are candidates.
"""

from __future__ import annotations

from graphmem.graph.devices import normalize_device
from graphmem.graph.index import VARIABLE_OPS, GraphIndex

# a first input from one of these keeps the IdentityN (Grappler's IsVariable and IsRecv)
_KEEPING_INPUTS = VARIABLE_OPS | {"AutoReloadVariable", "_Recv", "_HostRecv"}
_KEEPING_READERS = frozenset({"_Retval", "_DeviceRetval", "Merge", "RefMerge"})
_CONSTANTS = frozenset({"Const", "HostConst"})


def bypassed_identityn(index: GraphIndex, nodes: set[int]) -> list[int]:
    """The IdentityN ops of `nodes` with two or more inputs that Grappler bypasses, in
    index order."""
    ops, data_inputs = index.ops, index.data_inputs
    candidates = [i for i, op in enumerate(ops)
                  if op == "IdentityN" and i in nodes and not index.frame[i]
                  and len(data_inputs[i]) > 1]
    if not candidates:
        return []
    control_readers: dict[int, list[int]] = {i: [] for i in candidates}  # one per edge
    for r, sources in enumerate(index.control_inputs):
        for s in sources:
            if s in control_readers:
                control_readers[s].append(r)
    return [i for i in candidates if _bypassed(index, i, control_readers[i])]


def _bypassed(index: GraphIndex, i: int, control_readers: list[int]) -> bool:
    ops, data_inputs, control_inputs = index.ops, index.data_inputs, index.control_inputs
    ins = data_inputs[i]
    if not ins or ops[ins[0][0]] in _KEEPING_INPUTS:
        return False
    data_readers = index.data_consumers(i)  # one entry per input slot that reads it
    if any(ops[r] in _KEEPING_READERS for r in data_readers):
        return False
    controls = control_inputs[i]
    if controls:
        # a control input the data inputs already wait for goes first (the optimizer's
        # transitive reduction, or its pruning of a constant's control edges): only the
        # others stay
        implied = index.ancestors([s for s, _ in ins])
        controls = [c for c in controls if c not in implied and
                    not (ops[c] in _CONSTANTS and not index.data_inputs[c]
                         and not index.control_inputs[c])]
    n_in = len(ins) + len(controls)
    readers = set(data_readers) | set(control_readers)
    n_out = len(readers)
    edges = len(ins) + len(controls) * n_out + len(data_readers) + len(control_readers) * n_in
    if edges > n_in + n_out:
        return False
    device = normalize_device(index.devices[i])
    others = [s for s, _ in ins] + controls + list(readers)
    return all(normalize_device(index.devices[j]) == device for j in others)
