"""The floor: a step peak no recompute or swap plan can go under.

Whatever a plan keeps, recomputes or swaps, every op of the step still runs once with its
inputs and its outputs in memory at the same time, and its kernel's scratch beside them.
So the largest such footprint bounds every plan's peak from below. A feed (the input
batch) counts where an op reads it: the simulation frees it after its last reader like any
tensor (and TF's measured step peak does not count a NumPy feed at all: `python -m
benchmarks.feed_in_peak`, docs/benchmarks.md), so a plan that runs the backward
pass's largest op after the feed's last reader holds no feed there. It leaves
out what a plan might still have to keep alongside (checkpoints, gradients waiting for an
update that needs several of them), so the real lowest plan lies above it: recompute bounded
to about one extra forward pass keeps checkpoints, and only recomputing from the input again
and again (quadratic compute) would come near the floor. `plan` reports how far its lowest
plan is from it.

One pass over the step's ops, no per-op sets: linear in the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem.analysis.decay_terms import DecayJoin, decay_joins
from graphmem.analysis.identity_bypass import bypassed_identityn
from graphmem.analysis.kernel_scratch import has_scratch, scratch_model
from graphmem.analysis.regions import Regions, is_parameter_read
from graphmem.graph.index import GraphIndex


@dataclass
class FloorPart:
    name: str  # a tensor, or "<op> (scratch)"
    bytes: int
    role: str  # "input", "output" or "scratch"


@dataclass
class Floor:
    bytes: int  # the bound (0 when sizes are unknown)
    op: str = ""  # the op whose footprint sets it
    parts: list[FloorPart] = field(default_factory=list)  # largest first


def step_floor(index: GraphIndex, regions: Regions, batch_size: int | None,
               library: Message | None = None) -> Floor:
    """The floor of `index`'s training step (see the module docstring). An output as large
    as one of the op's inputs is not counted: the kernel may write it into that input's
    buffer (TF forwards buffers a kernel reads for the last time)."""
    step = regions.step_nodes(index)
    # an IdentityN Grappler bypasses never runs: its inputs need not live together
    step = step.difference(bypassed_identityn(index, step))
    sizes = index.output_sizes(batch_size)
    scratch = scratch_model(index, batch_size, library=library)
    # a large weight-decay sum runs as its gradient plus one piece of the term at a time
    # (passes/in_place_terms.py)
    joins = {d.join: d for d in decay_joins(index, regions)}
    best, best_op = -1, -1
    for i in step:
        if i in joins:
            d = joins[i]
            footprint = d.bytes + d.piece_bytes
        else:
            footprint = _footprint(index, i, sizes, scratch)
        if footprint > best:
            best, best_op = footprint, i
    if best_op < 0:
        return Floor(0)
    parts = _join_parts(index, joins[best_op]) if best_op in joins else \
        _parts(index, best_op, sizes, scratch)
    return Floor(best, index.names[best_op], parts)


def _inputs(index: GraphIndex, i: int):
    """Distinct data inputs that are activations (not variables, their reads or constants:
    those are persistent memory)."""
    seen = set()
    for t in index.data_inputs[i]:
        if t not in seen and not is_parameter_read(index, t[0]):
            seen.add(t)
            yield t


def _footprint(index: GraphIndex, i: int, sizes, scratch) -> int:
    ins = [sizes[t[0]][t[1]] or 0 for t in _inputs(index, i) if t[1] < len(sizes[t[0]])]
    in_sizes = set(ins)
    outs = sum(b or 0 for b in sizes[i] if b and b not in in_sizes)
    extra = scratch(i) if has_scratch(index.ops[i]) else 0
    return sum(ins) + outs + extra


def _parts(index: GraphIndex, i: int, sizes, scratch) -> list[FloorPart]:
    parts = []
    in_sizes = set()
    for t in _inputs(index, i):
        if t[1] >= len(sizes[t[0]]):
            continue
        b = sizes[t[0]][t[1]] or 0
        in_sizes.add(b)
        parts.append(FloorPart(index.tensor_name(t), b, "input"))
    for k, b in enumerate(sizes[i]):
        if b and b not in in_sizes:
            parts.append(FloorPart(index.tensor_name((i, k)), b, "output"))
    if has_scratch(index.ops[i]) and scratch(i):
        parts.append(FloorPart(f"{index.names[i]} (scratch)", scratch(i), "scratch"))
    parts.sort(key=lambda p: -p.bytes)
    return parts


def _join_parts(index: GraphIndex, d: DecayJoin) -> list[FloorPart]:
    parts = [FloorPart(index.tensor_name(d.gradient), d.bytes, "input"),
             FloorPart(f"{index.tensor_name((d.term, 0))} (one of {d.pieces} pieces)",
                       d.piece_bytes, "input")]
    parts.sort(key=lambda p: -p.bytes)
    return parts
