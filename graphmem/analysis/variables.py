"""The model's variables and their bytes: persistent memory, apart from the step's peak."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress

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
    return [Variable(index.names[i], shape, dtypes.name(dt or 0), nbytes(shape, dt))
            for i, shape, dt in _variables(index)]


def persistent_buffers(index: GraphIndex) -> list[tuple[int, int]]:
    """(node id, bytes) of each variable, in graph order: what sits in the allocator
    before a step starts."""
    found = ((i, nbytes(shape, dt)) for i, shape, dt in _variables(index))
    return [(i, b) for i, b in found if b]


def _variables(index: GraphIndex) -> list[tuple[int, list[int] | None, int | None]]:
    """(node id, shape, dtype) of each variable. Only variable ops and arguments are
    looked at: the candidates are found by type, at C speed."""
    out = []
    ops = index.ops
    for i in compress(range(len(ops)), map(_CANDIDATE_TYPES.__contains__, ops)):
        op = ops[i]
        node = index.node(i)
        if op in VARIABLE_OPS:
            shape = [d.size for d in node.attr["shape"].shape.dim] if "shape" in node.attr else None
            dt = node.attr["dtype"].type if "dtype" in node.attr else None
            out.append((i, shape, dt))
        elif node.attr["T"].type == dtypes.RESOURCE:  # an _Arg
            readers = [c for c in index.data_consumers(i) if ops[c] == "ReadVariableOp"]
            if not readers:
                continue
            r = readers[0]
            out.append((i, index.shape((r, 0)), index.node(r).attr["dtype"].type))
    return out


_CANDIDATE_TYPES = VARIABLE_OPS | {"_Arg"}


def persistent_bytes(index: GraphIndex) -> int:
    return sum(v.bytes or 0 for v in find_variables(index))


# ops whose result a constant input fixes: an initializer made of them (zeros, ones,
# `constant_initializer`) yields a constant, which TF folds into one `Const` tensor
_CONSTANT_EXPRESSION_OPS = frozenset({"Const", "HostConst", "Fill", "ZerosLike", "OnesLike",
                                      "Identity", "Cast", "Reshape", "BroadcastTo", "Pack",
                                      "Mul", "AddV2", "Add", "Sub"})
_MAX_EXPRESSION = 32  # ops looked at above an initial value


def constant_initialized(index: GraphIndex, step: set[int] | None = None) -> frozenset[int]:
    """Resource variables a TF1 session initializes from a constant (an `AssignVariableOp`
    outside the `step`, of a value made of constants alone). Why: TF then lets the variable
    share the constant's buffer, and the first in-place update of the variable (an
    optimizer's `ResourceApply*`, an `AssignAddVariableOp`) has to write a copy: measured,
    every zeros-initialized momentum slot and bias, and no randomly initialized weight, was
    copied by the first training step. One pass over the assignments."""
    ops = index.ops
    found: set[int] = set()
    for a in compress(range(len(ops)), map("AssignVariableOp".__eq__, ops)):
        if step is not None and a in step:
            continue
        ins = index.data_inputs[a]
        if len(ins) != 2:
            continue
        v = index.under_identities(ins[0])[0]
        if ops[v] == "VarHandleOp" and _constant_expression(index, ins[1][0]):
            found.add(v)
    return frozenset(found)


def _constant_expression(index: GraphIndex, top: int) -> bool:
    seen = {top}
    todo = [top]
    while todo:
        i = todo.pop()
        if index.ops[i] not in _CONSTANT_EXPRESSION_OPS:
            return False
        for s, _ in index.data_inputs[i]:
            if s not in seen:
                if len(seen) >= _MAX_EXPRESSION:
                    return False
                seen.add(s)
                todo.append(s)
    return True
