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

# What a signature's check found: None (fine, or not checkable), a str (why the node is
# refused), or its inputs as runs (count, base dtype or None, is_ref) and their total.
Expected = tuple[int, tuple[tuple[int, int | None, bool], ...]]


def check_graph(index, written_by_tensorflow: bool = True) -> None:
    """Raise InputError for the first node (in file order) that its OpDef refuses.

    Only graphs TensorFlow wrote (`written_by_tensorflow`: the file's GraphDef carries
    TF's version stamp) are held to TF's op definitions: a GraphDef built by hand (test
    graphs, the synthetic benchmark graphs) sets one dtype attr `T` on every node and
    leaves out inputs and attrs that nothing graphmem does reads."""
    if not written_by_tensorflow:
        index.signature_groups = None
        return
    _check_names(index)
    ops, names, registry = index.ops, index.names, index.registry
    nodes = index.graph_def.node
    data_inputs, out_dtypes = index.data_inputs, index.out_dtypes
    guessed = index.guessed_dtypes
    groups = index.signature_groups
    n = len(names)
    if groups is not None:  # one check per distinct (op, attrs) signature
        signature_of, firsts = groups
        found = [_check_signature(registry, ops[i], nodes[i]) for i in firsts]
        bad = [firsts[g] for g, r in enumerate(found) if isinstance(r, str)]
        stop = min(bad) if bad else n
        per_node = (found[s] for s in signature_of)
    else:
        stop = n
        per_node = (_check_signature(registry, ops[i], nodes[i]) for i in range(n))
    for i, expected in zip(range(stop), per_node, strict=False):
        if expected is None:
            continue
        if isinstance(expected, str):
            _refuse(index, i, expected)
        why = _inputs_mismatch(expected, data_inputs[i], out_dtypes, guessed, index)
        if why is not None:
            _refuse(index, i, why)
    if stop < n:
        _refuse(index, stop, _check_signature(registry, ops[stop], nodes[stop]))
    index.signature_groups = None  # only for this check: free the lists


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


def _inputs_mismatch(expected: Expected, inputs, out_dtypes, guessed, index) -> str | None:
    total, runs = expected
    if len(inputs) != total:
        return f"it takes {total} input{'s' if total != 1 else ''}, not {len(inputs)}"
    slot = 0
    for count, want, ref in runs:
        if want is None:
            slot += count
            continue
        for src, k in inputs[slot:slot + count]:
            have = out_dtypes[src]
            if have is None or k >= len(have) or src in guessed:
                continue
            got = have[k]
            if got == want and not ref:
                continue
            if got == want + 100 if ref else dtypes.base(got) == want:
                continue
            return (f"input {slot} is {dtypes.name(got)} from {index.names[src][:200]!r}, "
                    f"where it takes {dtypes.name(want + 100 if ref else want)}")
        slot += count
    return None


def _check_signature(registry, op: str, node: Message) -> Expected | str | None:
    """The checks that depend on the node's op and attrs: a str saying what is wrong, the
    inputs the op takes, or None when there is no OpDef to check against."""
    if op in _SYNTHETIC or op in registry.functions:
        return None  # a function call: its signature's attrs are the function's own
    op_def = registry.op_def(op)
    if op_def is None:
        return None
    attrs = node.attr
    defaults = registry.defaults(op, op_def)
    declared = set()
    for attr_def in op_def.attr:
        declared.add(attr_def.name)
        if attr_def.name in attrs:
            why = _attr_mismatch(attr_def, attrs[attr_def.name])
            if why is not None:
                return f"attr {attr_def.name!r} {why}"
        elif attr_def.name not in defaults:
            return f"it has no attr {attr_def.name!r}, which the op requires"
    for key in attrs:
        if key not in declared and not key.startswith("_"):
            return f"attr {key[:100]!r} is not one of the op's"
    return _expected_inputs(op_def, attrs, defaults)


def _attr_mismatch(attr_def: Message, value: Message) -> str | None:
    kind = value.WhichOneof("value")
    if kind == "placeholder":  # inside a function body: the function's attr, bound later
        return None
    declared = attr_def.type
    if declared.startswith("list("):
        if kind not in ("list", None):
            return f"is a {_WORD[kind]}, where the op takes a {declared}"
        items = getattr(value.list, _LIST_FIELD.get(declared, "s"), ())
        for field in _LIST_FIELD.values():
            if field != _LIST_FIELD.get(declared) and len(getattr(value.list, field)):
                return f"holds {field} values, where the op takes a {declared}"
        if attr_def.has_minimum and len(items) < attr_def.minimum:
            return f"lists {len(items)} values, fewer than the op's minimum {attr_def.minimum}"
        if declared == "list(type)":
            return _types_mismatch(attr_def, list(items))
        return None
    want = _KIND.get(declared)
    if want is None:  # "any" and kinds this check does not know
        return None
    if kind != want:
        got = "empty" if kind is None else f"a {_WORD[kind]}"
        return f"is {got}, where the op takes a {declared}"
    if declared == "type":
        return _types_mismatch(attr_def, [value.type])
    if declared == "int" and attr_def.has_minimum and value.i < attr_def.minimum:
        return f"is {value.i}, below the op's minimum {attr_def.minimum}"
    if declared == "string" and len(attr_def.allowed_values.list.s):
        if value.s not in attr_def.allowed_values.list.s:
            return f"is {value.s[:60]!r}, not one of the values the op allows"
    return None


def _types_mismatch(attr_def: Message, types: list[int]) -> str | None:
    valid = _valid_dtypes()
    allowed = attr_def.allowed_values.list.type
    for t in types:
        if t not in valid:
            return f"holds {t}, which is no valid DataType"
        if len(allowed) and t not in allowed:
            return f"is {dtypes.name(t)}, which the op does not allow"
    return None


def _expected_inputs(op_def: Message, attrs, defaults) -> Expected | None:
    """The op's inputs as runs of (count, base dtype, is_ref) from its input args and the
    node's attrs; None when an attr they depend on is not a plain value (a placeholder)."""
    runs = []
    total = 0
    for arg in op_def.input_arg:
        if arg.type_list_attr:
            value = _attr(attrs, defaults, arg.type_list_attr)
            if value is None or value.WhichOneof("value") not in ("list", None):
                return None
            for t in value.list.type:
                runs.append((1, t, arg.is_ref))
            total += len(value.list.type)
            continue
        count = 1
        if arg.number_attr:
            value = _attr(attrs, defaults, arg.number_attr)
            if value is None or value.WhichOneof("value") != "i":
                return None
            count = value.i
            if count < 0:
                return None  # the attr check says why
        if arg.type:
            t = arg.type
        elif arg.type_attr:
            value = _attr(attrs, defaults, arg.type_attr)
            if value is None or value.WhichOneof("value") != "type":
                return None
            t = value.type
        else:
            t = None
        runs.append((count, t, arg.is_ref))
        total += count
    return total, tuple(runs)


def _attr(attrs, defaults, key: str) -> Message | None:
    if key in attrs:
        return attrs[key]
    return defaults.get(key)


@cache
def _valid_dtypes() -> frozenset[int]:
    """DataType values other than DT_INVALID and the _REF ones (an attr names a base type)."""
    enum = protos.pool().FindEnumTypeByName("tensorflow.DataType")
    return frozenset(v.number for v in enum.values if 0 < v.number < 100)
