"""Each node checked against its op's definition, as TensorFlow's import checks it.

A graph that TensorFlow would refuse to import (a node missing a required attr, an attr of
the wrong kind or outside its allowed values, an invalid dtype, more or fewer inputs than
its attrs say, an input of another dtype than the op takes) must not pass through a rewrite
and be written back as if it were fine: it is refused with exit 2, naming the first such
node. Only what the file or TensorFlow defines is checked: an op type nobody defines is
accepted as it is (graphmem does not guess).

Linear in the graph: the attr checks depend on a node's op and attrs alone, so with the
compiled reader (which groups nodes by that signature) they run once per distinct
signature, and the per-node part is an input count and one dtype comparison per edge.
"""

from __future__ import annotations

import re
from functools import cache

from google.protobuf.message import Message

from graphmem import protos
from graphmem.errors import InputError
from graphmem.graph import dtypes

# synthetic nodes of a function's canonical graph (graph/function_view.py)
_SYNTHETIC = frozenset({"_Arg", "_Retval"})
_KIND = {"type": "type", "int": "i", "float": "f", "bool": "b", "string": "s",
         "shape": "shape", "tensor": "tensor", "func": "func"}
_WORD = {"s": "string", "i": "int", "f": "float", "b": "bool", "type": "type", "shape": "shape",
         "tensor": "tensor", "func": "func", "list": "list", "placeholder": "placeholder"}
_LIST_FIELD = {"list(type)": "type", "list(int)": "i", "list(float)": "f", "list(bool)": "b",
               "list(string)": "s", "list(shape)": "shape", "list(tensor)": "tensor",
               "list(func)": "func"}

# What a signature's check found: None (fine, or nothing to check against), a str (why the
# node is refused), or the inputs the op takes: [total, runs, slots] with runs of
# (count, dtype or None) and `slots` their expansion, made once the count is known to fit
# a node (a ref input's dtype is its base + 100).
Expected = list


def check_graph(index, written_by_tensorflow: bool = True) -> None:
    """Raise InputError for the first node (in file order) that its OpDef refuses.

    Only graphs TensorFlow wrote (`written_by_tensorflow`: the file's GraphDef carries
    TF's version stamp) are held to TF's op definitions: a GraphDef built by hand (test
    graphs, the synthetic benchmark graphs) sets one dtype attr `T` on every node and
    leaves out inputs and attrs that nothing graphmem does reads."""
    groups = index.signature_groups
    index.signature_groups = None  # only for this check: free the lists
    if not written_by_tensorflow:
        return
    _check_names(index)
    ops, registry = index.ops, index.registry
    nodes = index.graph_def.node
    data_inputs, out_dtypes = index.data_inputs, index.out_dtypes
    guessed = index.guessed_dtypes
    specs: dict[str, _OpSpec | None] = {}

    def check(i: int) -> Expected | str | None:
        op = ops[i]
        spec = specs.get(op, False)
        if spec is False:
            spec = specs[op] = _OpSpec.of(registry, op)
        return None if spec is None else spec.check(nodes[i].attr)

    n = len(ops)
    if groups is not None:  # one check per distinct (op, attrs) signature
        signature_of, firsts = groups
        found = [check(i) for i in firsts]
        bad = [firsts[g] for g, r in enumerate(found) if isinstance(r, str)]
        stop = min(bad) if bad else n
        per_node = map(found.__getitem__, signature_of)
    else:
        stop = n
        per_node = map(check, range(n))
    for i, expected in zip(range(stop), per_node, strict=False):
        if expected is None:
            continue
        if isinstance(expected, str):
            _refuse(index, i, expected)
        inputs = data_inputs[i]
        if len(inputs) != expected[0]:
            total = expected[0]
            _refuse(index, i, f"it takes {total} input{'s' if total != 1 else ''}, not "
                              f"{len(inputs)}")
        slots = expected[2]
        if slots is None:
            slots = expected[2] = tuple(t for count, t in expected[1] for _ in range(count))
        for slot, ((src, k), want) in enumerate(zip(inputs, slots, strict=True)):
            if want is None:
                continue
            have = out_dtypes[src]
            if have is None or k >= len(have):
                continue
            got = have[k]
            if got == want or (want < 100 and got == want + 100) or src in guessed:
                continue
            _refuse(index, i, f"input {slot} is {dtypes.name(got)} from "
                              f"{index.names[src][:200]!r}, where it takes {dtypes.name(want)}")
    if stop < n:
        _refuse(index, stop, check(stop))


# TensorFlow's IsValidNodeName (graph_constructor.cc), with a leading '_' allowed (names
# of internal ops, and of the synthetic nodes of a function's view)
_NAME = re.compile(r"[A-Za-z0-9._][A-Za-z0-9_.\-/]*(?:>[A-Za-z0-9.][A-Za-z0-9_.\-/]*)*")
_NAME_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-/>\n"
_BAD_START = re.compile(rb"\n[-/>\n]")


def _check_names(index) -> None:
    """Every node name is one TensorFlow's import accepts. All names at once, joined, with
    byte operations that run in C (a million names in about a tenth of a second): no
    character outside the allowed ones, no name empty or starting with '-', '/' or '>';
    only names with a '>' (rare) and a bad graph are looked at one by one."""
    names = index.names
    joined = ("\n" + "\n".join(names) + "\n").encode("utf-8", "surrogatepass")
    if (joined.translate(None, _NAME_BYTES) or _BAD_START.search(joined) is not None
            or joined.find(b">") >= 0):
        for i, name in enumerate(names):
            if _NAME.fullmatch(name) is None:
                raise InputError(f"node {name[:200]!r} ({index.ops[i][:100]}): the name has "
                                 "characters TensorFlow does not allow in node names")


def _refuse(index, i: int, why: str) -> None:
    name = index.names[i]
    raise InputError(f"node {name[:200]!r} ({index.ops[i][:100]}) does not match its op's "
                     f"definition: {why}")


class _OpSpec:
    """An OpDef as plain tuples, made once per op type: reading protobuf fields is what
    costs, so a signature's check reads only the node's attrs."""

    def __init__(self, op_def: Message, defaults: dict[str, Message]) -> None:
        self.defaults = defaults
        # (name, declared type, required, minimum or None, allowed types, allowed strings)
        self.attrs = tuple(
            (a.name, a.type, a.name not in defaults,
             a.minimum if a.has_minimum else None,
             frozenset(a.allowed_values.list.type) or None,
             frozenset(a.allowed_values.list.s) or None)
            for a in op_def.attr)
        self.declared = frozenset(a[0] for a in self.attrs)
        # (fixed dtype or 0, type attr, number attr, type list attr, is_ref)
        self.inputs = tuple((a.type, a.type_attr, a.number_attr, a.type_list_attr, a.is_ref)
                            for a in op_def.input_arg)

    @classmethod
    def of(cls, registry, op: str) -> _OpSpec | None:
        if op in _SYNTHETIC or op in registry.functions:
            return None  # a function call: its signature's attrs are the function's own
        op_def = registry.op_def(op)
        if op_def is None:
            return None
        return cls(op_def, registry.defaults(op, op_def))

    def check(self, attrs) -> Expected | str:
        """The checks that depend on the node's attrs: a str saying what is wrong, or the
        inputs the op takes."""
        for name, declared, required, minimum, types, strings in self.attrs:
            if name in attrs:
                why = _attr_mismatch(declared, minimum, types, strings, attrs[name])
                if why is not None:
                    return f"attr {name!r} {why}"
            elif required:
                return f"it has no attr {name!r}, which the op requires"
        if len(attrs) > len(self.attrs) or any(k not in self.declared for k in attrs):
            # sorted: a map's order differs between processes, the message must not
            extra = sorted(k for k in attrs if k not in self.declared and not k.startswith("_"))
            if extra:
                return f"attr {extra[0][:100]!r} is not one of the op's"
        return self._expected_inputs(attrs)

    def _expected_inputs(self, attrs) -> Expected | None:
        """The op's inputs as runs of (count, dtype) from its input args and the node's
        attrs; None when an attr they depend on is not a plain value (a placeholder)."""
        runs = []
        total = 0
        for fixed, type_attr, number_attr, list_attr, ref in self.inputs:
            if list_attr:
                value = self._attr(attrs, list_attr)
                if value is None or value.WhichOneof("value") not in ("list", None):
                    return None
                types = value.list.type
                runs.extend((1, t + 100 if ref else t) for t in types)
                total += len(types)
                continue
            count = 1
            if number_attr:
                value = self._attr(attrs, number_attr)
                if value is None or value.WhichOneof("value") != "i" or value.i < 0:
                    return None
                count = value.i
            if fixed:
                t = fixed
            elif type_attr:
                value = self._attr(attrs, type_attr)
                if value is None or value.WhichOneof("value") != "type":
                    return None
                t = value.type
            else:
                t = None
            runs.append((count, t + 100 if ref and t is not None else t))
            total += count
        return [total, tuple(runs), None]

    def _attr(self, attrs, key: str) -> Message | None:
        if key in attrs:
            return attrs[key]
        return self.defaults.get(key)


def _attr_mismatch(declared: str, minimum: int | None, types, strings,
                   value: Message) -> str | None:
    kind = value.WhichOneof("value")
    if kind == "placeholder":  # inside a function body: the function's attr, bound later
        return None
    if declared.startswith("list("):
        if kind not in ("list", None):
            return f"is a {_WORD[kind]}, where the op takes a {declared}"
        field = _LIST_FIELD.get(declared)
        items = ()
        for descriptor, values in value.list.ListFields() if kind == "list" else ():
            if descriptor.name != field:
                return (f"holds {_WORD.get(descriptor.name, descriptor.name)} values, where "
                        f"the op takes a {declared}")
            items = values
        if minimum is not None and len(items) < minimum:
            return f"lists {len(items)} values, fewer than the op's minimum {minimum}"
        if declared == "list(type)":
            return _types_mismatch(types, items)
        return None
    want = _KIND.get(declared)
    if want is None:  # "any" and kinds this check does not know
        return None
    if kind != want:
        got = "empty" if kind is None else f"a {_WORD[kind]}"
        return f"is {got}, where the op takes a {declared}"
    if declared == "type":
        return _types_mismatch(types, (value.type,))
    if declared == "int" and minimum is not None and value.i < minimum:
        return f"is {value.i}, below the op's minimum {minimum}"
    if declared == "string" and strings is not None and value.s not in strings:
        return f"is {value.s[:60]!r}, not one of the values the op allows"
    return None


def _types_mismatch(allowed, types) -> str | None:
    valid = _valid_dtypes()
    for t in types:
        if t not in valid:
            return f"holds {t}, which is no valid DataType"
        if allowed is not None and t not in allowed:
            return f"is {dtypes.name(t)}, which the op does not allow"
    return None


@cache
def _valid_dtypes() -> frozenset[int]:
    """DataType values other than DT_INVALID and the _REF ones (an attr names a base type)."""
    enum = protos.pool().FindEnumTypeByName("tensorflow.DataType")
    return frozenset(v.number for v in enum.values if 0 < v.number < 100)
