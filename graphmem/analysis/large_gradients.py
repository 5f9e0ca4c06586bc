"""Weight gradients far larger than what they are made from.

A fully connected layer's weight gradient is `x^T dy`: at VGG's fc1 a 25088 x 4096 matrix
(392 MiB at any batch size) made from the flattened pool output (3 MiB at batch 32) and the
layer's incoming gradient (0.5 MiB). The same holds for a convolution that plays a fully
connected layer (tf-slim's AlexNet and VGG: fc6 is a VALID convolution over the whole
feature map) and for its filter gradient. TF runs such a gradient as soon as its inputs
are ready, at the top of the backward pass, where every checkpoint is still alive, and its
update's temporaries (Keras' SGD: `momentum * velocity`, as large again) follow it there.
Run later, it costs the step its own few MiB of inputs, held a little longer
(passes/late_gradients.py picks where).

A candidate is a backward op of a weight-gradient kind whose output is at least MIN_BYTES
and at least RATIO times the bytes of its inputs (variables and constants not counted:
they are persistent), whose output reaches an optimizer write through the backward and
optimizer regions alone within a short walk, and is read by no backward op outside that
walk (nothing of the backward chain waits for it) and by no collective op (an all-reduce
of data-parallel replicas, whose order a move could change). One pass over the backward ops, and a
walk of at most WALK_BUDGET ops per candidate: linear in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.kernel_fusions import FILTER_GRADIENTS
from graphmem.analysis.regions import Regions, is_parameter_read, is_state_write
from graphmem.analysis.towers import is_collective
from graphmem.graph.index import GraphIndex

MIN_BYTES = 16 * 2 ** 20
RATIO = 8
# ops between a gradient and its update: Keras' momentum SGD about 8, a decay term added in
# place in 64 pieces (passes/in_place_terms.py) about 200; only gradients of MIN_BYTES walk
WALK_BUDGET = 1024
WEIGHT_GRADIENT_OPS = FILTER_GRADIENTS | {"MatMul", "_MklMatMul", "Conv2DBackpropFilterV2"}


@dataclass
class LargeGradient:
    op: int  # the op making the gradient
    bytes: int  # its output
    input_bytes: int  # of its inputs that are not persistent
    own_ops: list[int]  # the ops only it feeds: its plumbing, the optimizer's arithmetic
    # on it, its update, and the optimizer ops that wait for that update


def has_large_outputs(index: GraphIndex, regions: Regions, batch_size: int | None) -> bool:
    """Whether any backward op of a weight-gradient kind makes MIN_BYTES or more: the cheap
    test before `large_gradients` (no walks)."""
    sizes = index.output_bytes(batch_size)
    return any(_large_output(index, sizes, g) for g in regions.backward)


def large_gradients(index: GraphIndex, regions: Regions, step: set[int],
                    batch_size: int | None) -> list[LargeGradient]:
    """The candidates, largest first."""
    sizes = index.output_bytes(batch_size)
    backward, optimizer = regions.backward, regions.optimizer
    found = []
    for g in backward:
        if not _large_output(index, sizes, g) or g not in step or index.in_loop(g) \
                or index.may_be_dead(g):
            continue
        out = sizes(g)
        feed = 0
        for s, k in index.data_inputs[g]:
            if is_parameter_read(index, s):
                continue
            b = sizes(s)
            if k >= len(b) or b[k] is None:
                feed = None
                break
            feed += b[k]
        if feed is None or feed * RATIO > out[0]:
            continue
        own = _own_ops(index, g, backward, optimizer)
        if own:
            found.append(LargeGradient(g, out[0], feed, own))
    found.sort(key=lambda c: (-c.bytes, index.position[c.op]))
    return found


def _large_output(index: GraphIndex, sizes, g: int) -> bool:
    if index.ops[g] not in WEIGHT_GRADIENT_OPS:
        return False
    out = sizes(g)
    return bool(out) and out[0] is not None and out[0] >= MIN_BYTES


def _own_ops(index: GraphIndex, g: int, backward: set[int], optimizer: set[int]
                ) -> list[int] | None:
    """The ops `g`'s output reaches by data edges (the gradient's plumbing, the optimizer's
    arithmetic on it, its update), when all are backward or optimizer ops, none of them
    a weight gradient (which would make `g` part of the chain), they hold a state write,
    and there are at most WALK_BUDGET; then also the optimizer ops that wait for those
    writes (Keras reads a slot back after writing it, then writes the variable), short of
    an op that also waits for another gradient's update (TF1's `update` group of every
    update, and the global step's increment after it). None otherwise."""
    seen, stack = {g}, [g]
    reached: list[int] = []
    writes = 0
    while stack:
        i = stack.pop()
        for j in index.data_consumers(i):
            if j in seen:
                continue
            seen.add(j)
            if len(seen) > WALK_BUDGET or (j not in backward and j not in optimizer) or \
                    index.ops[j] in WEIGHT_GRADIENT_OPS or is_collective(index.ops[j]):
                # read by something that is not its own update, or all-reduced: every
                # replica must issue its collectives in one order, which a move could change
                return None
            reached.append(j)
            writes += is_state_write(index.ops[j])
            stack.append(j)
    if not writes:
        return None
    stack = [j for j in reached if j in optimizer]
    while stack:
        i = stack.pop()
        for j in index.data_consumers(i) + index.control_consumers[i]:
            if j in seen or j not in optimizer or _waits_for_other_writes(index, j, seen):
                continue
            seen.add(j)
            if len(seen) > WALK_BUDGET:
                return None
            reached.append(j)
            stack.append(j)
    return reached


def _waits_for_other_writes(index: GraphIndex, j: int, own: set[int]) -> bool:
    """Whether op j waits for a state write that is not among `own`: it joins several
    gradients' updates, and is none of them's own."""
    ops = index.ops
    return any(is_state_write(ops[p]) and p not in own for p in index.ordering_preds(j))
