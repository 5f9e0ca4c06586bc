"""Last readers write in place: of the backward ops that read a large tensor, an element-wise
one runs last, so that TensorFlow hands it the tensor's buffer instead of a new one.

Why: an element-wise kernel writes into an input buffer that nothing else will read any
more (TF's `forward_input_or_allocate_output`), and it knows that only when it is the last
of the buffer's readers to run. An unfused batch norm's gradient (Keras builds its batch
norms so) reads the incoming gradient `dy` three times: `Sum(dy)` for the offset, `dy * x`
for the scale, `dy * scale` for dx. Run in TF's order, `dy * scale` comes first and gets a
buffer of its own while `dy` lives on for the others; at two inter-op threads the three run
together. That was one full-size buffer more than needed at the peak of Keras MobileNetV2
(its first block, 147 MiB at batch 32). A control edge from each other reader into the
element-wise one makes it the last: it then writes into `dy`'s buffer.

A tensor qualifies when it is made in the backward pass, is at least MIN_BYTES, and all its
readers are plain backward ops on its device that always run. The element-wise reader must
make an output of the tensor's size and dtype (so that it can take the buffer); of several,
the one TF's order puts last. The other readers must not wait for anything the tensor's
producer does not (their other inputs come before it in topological order, or are
constants), so that the edges only order ops that are ready together: nothing is held back behind a
long chain. Edges of all tensors are checked for cycles together (one Kahn pass). Only the
order changes, never a value.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.analysis.memory import FORWARDING_OPS
from graphmem.analysis.regions import Regions
from graphmem.graph.index import GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, add_edge_groups

MIN_BYTES = 1 << 20  # smaller tensors are not worth an edge


@dataclass
class LastReadersPlan(PassPlan):
    tensors: int = 0  # tensors whose element-wise reader now runs last
    bytes: int = 0  # their sizes, summed: buffers the readers no longer allocate

    @property
    def changed(self) -> bool:
        return self.tensors > 0


def apply_last_readers(index: GraphIndex, regions: Regions,
                       batch_size: int | None) -> LastReadersPlan:
    """Add the control edges to index.graph_def and to the index (no re-index needed)."""
    plan = LastReadersPlan()
    sizes = index.output_bytes(batch_size)
    step = regions.step_nodes(index)
    backward = regions.backward & step
    position = index.position
    edges: dict[tuple[int, int], list[tuple[int, int]]] = {}
    saved: dict[tuple[int, int], int] = {}
    for (i, k), readers in index.consumers.items():
        if i not in backward:
            continue
        b = sizes(i)[k] if k < len(sizes(i)) else None
        readers = list(dict.fromkeys(readers))
        if b is None or b < MIN_BYTES or len(readers) < 2 or \
                not all(_plain(index, backward, r, i) for r in readers):
            continue
        dtype = index.dtype((i, k))
        takers = [r for r in readers if index.ops[r] in FORWARDING_OPS
                  and sizes(r) and sizes(r)[0] == b and index.dtype((r, 0)) == dtype]
        if not takers:
            continue
        last = max(takers, key=position.__getitem__)
        others = [r for r in readers if r != last]
        if not all(_ready_with(index, o, i) for o in others):
            continue
        new = [(o, last) for o in others if o not in index.control_inputs[last]]
        if new:
            edges[(i, k)] = new
            saved[(i, k)] = b
    add_edge_groups(index, edges)
    plan.tensors = len(edges)
    plan.bytes = sum(saved[key] for key in edges)
    return plan


def _plain(index: GraphIndex, backward: set[int], r: int, producer: int) -> bool:
    """r is a backward op that always runs, on the producer's device, outside loops and
    conditionals."""
    return (r in backward and not index.stateful[r] and not index.in_loop(r)
            and not index.may_be_dead(r) and not index.is_control_flow(r)
            and index.devices[r] == index.devices[producer])


def _ready_with(index: GraphIndex, r: int, producer: int) -> bool:
    """Every input of r but the tensor (and constants) comes before the tensor's producer
    in topological order: r is ready about when the tensor is, so that waiting for it holds
    nothing back."""
    before = index.position[producer]
    return all(s == producer or index.position[s] < before or index.ops[s] == "Const"
               for s, _ in index.data_inputs[r]) and \
        all(index.position[c] < before for c in index.control_inputs[r])


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LastReadersPass(Pass):
    """An element-wise reader of a large backward tensor runs last and writes in place."""

    name, edits = "last readers", Edits.CONTROL_EDGES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> LastReadersPlan:
        return apply_last_readers(context.index, context.regions, context.options.batch_size)
