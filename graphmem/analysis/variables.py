"""The model's variables and their bytes: persistent memory, apart from the step's peak."""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.graph import dtypes
from graphmem.graph.index import VARIABLE_OPS, GraphIndex, nbytes


@dataclass
class Variable:
    name: str
    shape: list[int] | None
    dtype: str
    bytes: int | None


def find_variables(index: GraphIndex) -> list[Variable]:
    """Variable ops of a TF1 graph, or resource arguments of a function that are read as values."""
    return [v for _, v in _variables(index)]


def persistent_buffers(index: GraphIndex) -> list[tuple[int, int]]:
    """(node id, bytes) of each variable, in graph order: what sits in the allocator
    before a step starts."""
    return [(i, v.bytes) for i, v in _variables(index) if v.bytes]


def _variables(index: GraphIndex) -> list[tuple[int, Variable]]:
    out = []
    for i, op in enumerate(index.ops):
        if op not in VARIABLE_OPS and op != "_Arg":
            continue
        node = index.node(i)
        if op in VARIABLE_OPS:
            shape = [d.size for d in node.attr["shape"].shape.dim] if "shape" in node.attr else None
            dt = node.attr["dtype"].type if "dtype" in node.attr else None
            out.append((i, Variable(index.names[i], shape, dtypes.name(dt or 0),
                                    nbytes(shape, dt))))
        elif op == "_Arg" and node.attr["T"].type == dtypes.RESOURCE:
            readers = [c for c in index.data_consumers(i) if index.ops[c] == "ReadVariableOp"]
            if not readers:
                continue
            r = readers[0]
            shape, dt = index.shape((r, 0)), index.node(r).attr["dtype"].type
            out.append((i, Variable(index.names[i], shape, dtypes.name(dt), nbytes(shape, dt))))
    return out


def persistent_bytes(index: GraphIndex) -> int:
    return sum(v.bytes or 0 for v in find_variables(index))
