"""NodeDefs the passes add, built one way: names that do not collide, scalar and int32
constants, Identity copies of a tensor, other ops with their types and static shapes.

Attributes are set in one fixed order (type, value, `_output_shapes`, then the caller's),
so that a rewritten graph serializes to the same bytes whichever pass built the node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from google.protobuf.message import Message

from graphmem import protos
from graphmem.graph import dtypes
from graphmem.graph.names import input_string, parse_input

if TYPE_CHECKING:
    from graphmem.graph.index import GraphIndex


def unique_name(name: str, taken: Callable[[str], bool]) -> str:
    """`name`, or `name_1`, `name_2`, ... : the first that `taken` says is free."""
    base, n = name, 0
    while taken(name):
        n += 1
        name = f"{base}_{n}"
    return name


def redirect_readers(index: GraphIndex, olds: Iterable[int], replaced: dict[str, str]) -> None:
    """Point the readers of the ops `olds` (data and control inputs naming an op of
    `replaced`, old name -> new name) at its replacement, in `index.graph_def`. The old ops
    themselves are left as they are (unread, a pass replaces them)."""
    olds = set(olds)
    readers = {c for i in olds for c in index.data_consumers(i)}
    readers |= {c for i in olds for c in index.control_consumers[i]}
    g = index.graph_def
    for c in sorted(readers - olds):
        node = g.node[c]
        for slot, text in enumerate(node.input):
            src, k, control = parse_input(text)
            if src in replaced:
                node.input[slot] = "^" + replaced[src] if control else \
                    input_string(replaced[src], k)


def add_scalar_const(graph: Message, name: str, dtype: int, value: int | None = None,
                     device: str = "", controls: Iterable[str] = ()) -> Message:
    """Append a scalar Const to `graph`: `value` (an integer, for shapes and counters) or
    the zero of `dtype`, run after the ops named in `controls`."""
    node = graph.node.add(name=name, op="Const")
    if device:
        node.device = device
    node.input.extend("^" + c for c in controls)
    node.attr["dtype"].type = dtype
    t = node.attr["value"].tensor
    t.dtype = dtype
    t.tensor_shape.SetInParent()
    if value is not None:
        if dtype == dtypes.INT64:
            t.int64_val.append(value)
        else:
            t.int_val.append(value)
    node.attr["_output_shapes"].list.shape.add()
    return node


def identity_node(name: str, inputs: Iterable[str], device: str, dtype: int | None = None,
                  shape: list[int] | Message | None = None) -> Message:
    """A new Identity NodeDef (not yet in a graph) reading `inputs` (its data input, then
    any control inputs), typed `dtype` and shaped `shape` (dims, or a TensorShapeProto)."""
    node = protos.NodeDef()
    node.name, node.op, node.device = name, "Identity", device
    node.input.extend(inputs)
    if dtype is not None:
        node.attr["T"].type = dtype
    if shape is not None:
        s = node.attr["_output_shapes"].list.shape.add()
        if isinstance(shape, list):
            for d in shape:
                s.dim.add(size=d)
        else:
            s.CopyFrom(shape)
    return node


def add_int32_const(graph: Message, name: str, values: list[int], shape: list[int],
                    device: str = "") -> Message:
    """Append an int32 Const of `shape` holding `values` (shapes, offsets, indices)."""
    node = graph.node.add(name=name, op="Const")
    if device:
        node.device = device
    node.attr["dtype"].type = dtypes.INT32
    t = node.attr["value"].tensor
    t.dtype = dtypes.INT32
    for d in shape:
        t.tensor_shape.dim.add(size=d)
    t.int_val.extend(values)
    _set_shape(node, shape)
    return node


def add_op(graph: Message, name: str, op: str, inputs: Iterable[str], device: str,
           attrs: dict[str, int], shape: list[int]) -> Message:
    """Append `op` reading `inputs` (data, then control), its type attrs (`{"T": dtype}`)
    set in the order given and its one output shaped `shape`."""
    node = graph.node.add(name=name, op=op)
    if device:
        node.device = device
    node.input.extend(inputs)
    for key, dtype in attrs.items():
        node.attr[key].type = dtype
    _set_shape(node, shape)
    return node


def _set_shape(node: Message, shape: list[int]) -> None:
    s = node.attr["_output_shapes"].list.shape.add()  # no dims: a scalar
    for d in shape:
        s.dim.add(size=d)
