"""A FunctionDef seen as a GraphDef, and back.

Function bodies write inputs as `node:output_arg:index` and read their arguments by bare name;
the rest of graphmem speaks GraphDef (`node:k`). This module translates both ways so that one
index, one set of analyses and one set of passes serve TF1 graphs and TF2 train steps alike.
Arguments become `_Arg` nodes, results `_Retval` nodes and control results `^` inputs of a
`NoOp`; all three are synthetic and are dropped again when the body is written back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem import protos
from graphmem.errors import InputError
from graphmem.graph.names import output_index
from graphmem.graph.opdefs import OpRegistry

ARG_OP, RETVAL_OP = "_Arg", "_Retval"
CONTROL_RET_NODE = "_graphmem_control_ret"
_RETVAL_PREFIX = "_graphmem_retval/"


@dataclass
class FunctionView:
    """The canonical GraphDef of one function, plus what is needed to write it back."""

    function: Message
    graph_def: Message
    registry: OpRegistry
    arg_names: set[str] = field(default_factory=set)
    _arg_sizes: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    @classmethod
    def build(cls, function: Message, registry: OpRegistry) -> FunctionView:
        view = cls(function, protos.GraphDef(), registry)
        g = view.graph_def
        for i, arg in enumerate(function.signature.input_arg):
            node = g.node.add(name=arg.name, op=ARG_OP)
            node.attr["index"].i = i
            if arg.type:
                node.attr["T"].type = arg.type
            view.arg_names.add(arg.name)
            shapes = function.arg_attr[i].attr.get("_output_shapes") if i in function.arg_attr else None
            if shapes is not None:
                node.attr["_output_shapes"].CopyFrom(shapes)
        for src in function.node_def:
            sizes = registry.output_arg_sizes(src)
            if sizes is None:
                raise InputError(f"function {function.signature.name}: no op definition for "
                                 f"{src.op!r} (node {src.name}); is TensorFlow installed?")
            view._arg_sizes[src.name] = sizes
        for src in function.node_def:
            node = g.node.add()
            node.CopyFrom(src)
            del node.input[:]
            node.input.extend(view._to_graph_input(s) for s in src.input)
        for out in function.signature.output_arg:
            node = g.node.add(name=_RETVAL_PREFIX + out.name, op=RETVAL_OP)
            node.input.append(view._to_graph_input(function.ret[out.name]))
        if function.control_ret:
            node = g.node.add(name=CONTROL_RET_NODE, op="NoOp")
            node.input.extend("^" + n for n in sorted(function.control_ret.values()))
        return view

    def _to_graph_input(self, text: str) -> str:
        if text.startswith("^"):
            return text
        parts = text.split(":")
        if len(parts) == 1:
            return text  # an argument, read by bare name
        if len(parts) == 2 and parts[0] in self.arg_names:
            return parts[0]
        if len(parts) > 3 or (len(parts) == 3 and not (parts[2].isascii()
                                                      and parts[2].isdigit())):
            raise InputError(f"function {self.function.signature.name}: cannot resolve "
                             f"input {text[:200]!r}")
        node, arg, idx = parts[0], parts[1], output_index(parts[2]) if len(parts) > 2 else 0
        offset = 0
        for name, count in self._arg_sizes.get(node, []):
            if name == arg:
                flat = offset + idx
                return node if flat == 0 else f"{node}:{flat}"
            offset += count
        raise InputError(f"function {self.function.signature.name}: cannot resolve input {text!r}")

    def _to_function_input(self, text: str) -> str:
        if text.startswith("^") or text in self.arg_names:
            return text
        node, _, idx = text.partition(":")
        flat = output_index(idx) if idx.isascii() and idx.isdigit() else 0
        offset = 0
        for name, count in self._arg_sizes[node]:
            if flat < offset + count:
                return f"{node}:{name}:{flat - offset}"
            offset += count
        raise ValueError(f"{text} is past the outputs of {node}")

    def write_back(self) -> None:
        """Replace the function's body with the (possibly rewritten) canonical graph."""
        fn = self.function
        body = [n for n in self.graph_def.node
                if n.op not in (ARG_OP, RETVAL_OP) and n.name != CONTROL_RET_NODE]
        for node in body:
            if node.name not in self._arg_sizes:
                sizes = self.registry.output_arg_sizes(node)
                if sizes is None:
                    raise InputError(f"no op definition for {node.op!r} (node {node.name})")
                self._arg_sizes[node.name] = sizes
        del fn.node_def[:]
        for node in body:
            out = fn.node_def.add()
            out.CopyFrom(node)
            del out.input[:]
            out.input.extend(self._to_function_input(s) for s in node.input)
        for node in self.graph_def.node:
            if node.op == RETVAL_OP:
                fn.ret[node.name[len(_RETVAL_PREFIX):]] = self._to_function_input(node.input[0])


def functions_named(node: Message) -> set[str]:
    """Library functions a node names in its attrs (While bodies and conditions, If
    branches, PartitionedCall targets)."""
    names = set()
    for value in node.attr.values():
        kind = value.WhichOneof("value")
        if kind == "func":
            names.add(value.func.name)
        elif kind == "list":
            names.update(f.name for f in value.list.func)
    return names
