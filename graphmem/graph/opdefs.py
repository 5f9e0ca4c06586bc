"""What the tool knows about op types: statefulness and output signatures.

Sources, in order: the MetaGraphDef's stripped op list, the graph's own function library
(a call to a library function is an op whose type is the function's name), TensorFlow's op
registry when TensorFlow is importable, and a conservative built-in rule as the last resort.
Only the registry lookup imports TensorFlow, and only for op types the file does not describe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem import protos

# Used only when no OpDef can be found: anything that may touch state counts as stateful.
_STATEFUL_PREFIXES = (
    "Assign", "ResourceApply", "Apply", "ResourceScatter", "Scatter", "ResourceSparseApply",
    "SparseApply", "Random", "StatelessRandomGetKeyCounter", "Stateful", "Queue", "Iterator",
    "Variable", "VarHandle", "ReadVariable", "TemporaryVariable", "DestroyTemporaryVariable",
    "Stack", "TensorArray", "Save", "Restore", "Print", "Assert", "HashTable", "Lookup",
    "MutableHashTable", "Multinomial", "TruncatedNormal", "ParameterizedTruncatedNormal",
    "RandomShuffle", "AnonymousIterator", "MakeIterator", "OneShotIterator", "_Recv", "_Send",
)
_STATELESS_EXCEPTIONS = ("StatelessRandom",)


@dataclass
class OpRegistry:
    op_defs: dict[str, Message] = field(default_factory=dict)
    functions: dict[str, Message] = field(default_factory=dict)  # FunctionDef.signature by name
    use_tensorflow: bool = True
    _tf_cache: dict[str, Message | None] = field(default_factory=dict)
    _defaults: dict[str, dict[str, Message]] = field(default_factory=dict)

    def defaults(self, op_type: str, op_def: Message) -> dict[str, Message]:
        found = self._defaults.get(op_type)
        if found is None:
            found = self._defaults[op_type] = attr_defaults(op_def)
        return found

    @classmethod
    def for_graph(cls, graph_def: Message, meta_graph: Message | None = None,
                  use_tensorflow: bool = True) -> OpRegistry:
        reg = cls(use_tensorflow=use_tensorflow)
        if meta_graph is not None:
            for op in meta_graph.meta_info_def.stripped_op_list.op:
                reg.op_defs[op.name] = op
        for fdef in graph_def.library.function:
            reg.functions[fdef.signature.name] = fdef.signature
        return reg

    def op_def(self, op_type: str) -> Message | None:
        found = self.op_defs.get(op_type) or self.functions.get(op_type)
        if found is not None or not self.use_tensorflow:
            return found
        if op_type not in self._tf_cache:
            self._tf_cache[op_type] = _registry_op_def(op_type)
        return self._tf_cache[op_type]

    def describes(self, op_types) -> bool:
        """Whether every op type is known without asking TensorFlow (which would import
        it): from the file's op list or library, or because TensorFlow is not to be asked."""
        return not self.use_tensorflow or all(
            op in self.op_defs or op in self.functions for op in op_types)

    def is_stateful(self, op_type: str) -> bool:
        op_def = self.op_def(op_type)
        if op_def is not None:
            return bool(op_def.is_stateful)
        if op_type.startswith(_STATELESS_EXCEPTIONS):
            return False
        return op_type.startswith(_STATEFUL_PREFIXES)

    def output_dtypes(self, node: Message) -> list[int] | None:
        """Output dtypes of `node` from its OpDef and attrs; None when they cannot be known."""
        op_def = self.op_def(node.op)
        if op_def is None:
            return None
        defaults = self.defaults(node.op, op_def)
        out: list[int] = []
        for arg in op_def.output_arg:
            types = _arg_types(arg, node, defaults)
            if types is None:
                return None
            out.extend(types)
        return out

    def output_attr_names(self, op_type: str) -> tuple[str, ...] | None:
        """The attrs that decide `op_type`'s output dtypes (None without an OpDef)."""
        op_def = self.op_def(op_type)
        if op_def is None:
            return None
        names: list[str] = []
        for arg in op_def.output_arg:
            for attr in (arg.type_attr, arg.number_attr, arg.type_list_attr):
                if attr and attr not in names:
                    names.append(attr)
        return tuple(names)

    def output_arg_sizes(self, node: Message) -> list[tuple[str, int]] | None:
        """(output arg name, how many tensors it holds), for FunctionDef name translation."""
        op_def = self.op_def(node.op)
        if op_def is None:
            return None
        defaults = self.defaults(node.op, op_def)
        sizes = []
        for arg in op_def.output_arg:
            types = _arg_types(arg, node, defaults)
            if types is None:
                return None
            sizes.append((arg.name, len(types)))
        return sizes


def _arg_types(arg: Message, node: Message, defaults: dict[str, Message]) -> list[int] | None:
    attrs = _Attrs(node, defaults)
    if arg.type_list_attr:
        if arg.type_list_attr not in attrs:
            return None
        return list(attrs[arg.type_list_attr].list.type)
    if arg.type:
        single = arg.type
    elif arg.type_attr and arg.type_attr in attrs:
        single = attrs[arg.type_attr].type
    elif arg.type_attr:
        return None
    else:
        single = 0
    if arg.is_ref:
        single += 100
    if arg.number_attr:
        if arg.number_attr not in attrs:
            return None
        return [single] * attrs[arg.number_attr].i
    return [single]


def _registry_op_def(op_type: str) -> Message | None:
    from graphmem.runtime.tf_loader import available, tensorflow

    if not available():
        return None
    tensorflow()
    from tensorflow.python.framework import op_def_registry  # noqa: PLC0415

    found = op_def_registry.get(op_type)
    if found is None:
        return None
    ours = protos.message_class("tensorflow.OpDef")()
    ours.ParseFromString(found.SerializeToString())
    return ours


def attr_defaults(op_def: Message) -> dict[str, Message]:
    return {a.name: a.default_value for a in getattr(op_def, "attr", ())
            if a.HasField("default_value")}


class _Attrs:
    """A node's attrs, falling back to the OpDef's defaults (SavedModels strip them)."""

    def __init__(self, node: Message, defaults: dict[str, Message]) -> None:
        self._node = node
        self._defaults = defaults

    def __contains__(self, key: str) -> bool:
        return key in self._node.attr or key in self._defaults

    def __getitem__(self, key: str) -> Message:
        if key in self._node.attr:
            return self._node.attr[key]
        return self._defaults[key]
