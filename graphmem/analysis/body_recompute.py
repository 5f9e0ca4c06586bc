"""Which values a loop body keeps for its gradient, and which it could recompute instead.

A loop keeps, per iteration, every body value its gradient reads (control flow v2: one tensor
list per value; v1: one stack). Most of them are cheap functions of a few others: an LSTM cell
needs only its loop-carried state (h, c), its input at that step and the weights to rebuild
its gates. This module answers, for one body graph (a function viewed as a GraphDef, or a
frame's ops), which accumulated values can be rebuilt from which *kept* values, and which ops
a rebuild copies. It only states facts; the passes decide how to keep values and where the
copies go (`passes/loop_recompute.py` for v2 tensor lists).

Kept, never rebuilt (a rebuild could yield another value, or cannot see the input):
- the body's arguments (loop-carried values and loop invariants);
- outputs of stateful ops (variable reads, random ops such as dropout masks), of control
  flow and function calls (`If`, nested `While`, `PartitionedCall`), of ops on lists,
  stacks or other handles (`TensorListGetItem` of the input sequence), and of ops with
  control inputs;
- outputs of the op types the caller names in `keep_ops` (the speed policy: matmuls and
  convolutions);
- accumulated values smaller than `min_bytes` (nothing to save: shapes, counters).
Everything else is copied: the walk from an accumulated value up its inputs stops at kept
values (the *sources* the rebuild reads) and at constants (copied too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.graph import dtypes
from graphmem.graph.function_view import ARG_OP, RETVAL_OP, functions_named
from graphmem.graph.index import CONTROL_FLOW_V1, CONTROL_FLOW_V2, GraphIndex, Tensor

_HANDLE_TYPES = frozenset({dtypes.RESOURCE, dtypes.VARIANT})
_HANDLE_PREFIXES = ("TensorList", "TensorArray", "Stack")
_MAX_WALK = 10_000  # ops one rebuild may copy: a body that large is left alone


@dataclass
class Rebuild:
    """How one accumulated value is rebuilt from kept values of the same iteration."""

    value: Tensor
    sources: list[Tensor]  # kept values the copies read
    ops: list[int]  # ops it copies (constants included), unordered


@dataclass
class BodyRecompute:
    """The verdict on each accumulated value of one body."""

    rebuilt: dict[Tensor, Rebuild] = field(default_factory=dict)
    kept: dict[Tensor, str] = field(default_factory=dict)  # value -> why it stays

    def copy_order(self, index: GraphIndex, values: list[Tensor]) -> list[int]:
        """Ops to copy for `values` (a subset of `rebuilt`), in topological order."""
        ops = {i for v in values for i in self.rebuilt[v].ops}
        return sorted(ops, key=index.position.__getitem__)


def why_not_copyable(index: GraphIndex, i: int) -> str | None:
    """Why op i must not be copied into the gradient body (None: it may be)."""
    op = index.ops[i]
    if op in (ARG_OP, RETVAL_OP):
        return "loop-carried input or invariant"
    if op in CONTROL_FLOW_V2 or op in CONTROL_FLOW_V1 or functions_named(index.node(i)):
        return f"control flow or function call ({op})"
    if op.startswith(_HANDLE_PREFIXES):
        return f"list or stack op ({op})"
    if index.stateful[i]:
        return f"stateful op ({op})"
    if index.control_inputs[i] and op not in ("Const", "HostConst"):
        return "op with control inputs"  # (a constant's copy drops them)
    types = list(index.out_dtypes[i] or [])
    types += [t for t in (index.dtype(s) for s in index.data_inputs[i]) if t is not None]
    if any(t in _HANDLE_TYPES or t > 100 for t in types):
        return "reads or makes a handle or reference"
    if index.out_dtypes[i] is None:
        return f"output types unknown ({op})"
    return None


def plan_body_recompute(index: GraphIndex, accumulated: list[Tensor],
                        keep_ops: frozenset[str] = frozenset(), batch_size: int | None = None,
                        min_bytes: int = 1024,
                        forced: dict[Tensor, str] | None = None) -> BodyRecompute:
    """Classify each accumulated value of a body: rebuilt (with its sources and copies) or
    kept (with the reason). A rebuild reads accumulated values that are kept wherever it
    meets them (they are there anyway). `forced`: values the caller keeps, with the reason
    (a source it cannot provide). Linear in the body per accumulated value (bodies are
    small)."""
    result = BodyRecompute()
    forced = forced or {}
    verdict: dict[int, str | None] = {}

    def stop(i: int) -> str | None:  # why op i's outputs are sources, None: copy it
        if i not in verdict:
            why = why_not_copyable(index, i)
            if why is None and index.ops[i] in keep_ops:
                why = f"kept by the policy ({index.ops[i]})"
            verdict[i] = why
        return verdict[i]

    sizes = index.output_bytes(batch_size)
    pending = []
    for v in accumulated:
        if v in result.kept or v in pending:
            continue
        why = forced.get(v) or stop(v[0])
        if why is None and index.ops[v[0]] in ("Const", "HostConst"):
            why = "constant"
        if why is None:
            b = sizes(v[0])
            nb = b[v[1]] if v[1] < len(b) else None
            if nb is not None and nb < min_bytes:
                why = f"small ({nb} bytes)"
        if why is not None:
            result.kept[v] = why
        else:
            pending.append(v)
    held = set(result.kept)
    for v in pending:
        rebuild = _walk(index, v, stop, held)
        if rebuild is None:
            result.kept[v] = "too many ops to copy"
        else:
            result.rebuilt[v] = rebuild
    return result


def _walk(index: GraphIndex, v: Tensor, stop, held: set[Tensor]) -> Rebuild | None:
    """Up the inputs of v through copyable ops: the ops to copy and the kept values read
    (`held`: values kept anyway, read where met)."""
    ops: list[int] = []
    sources: list[Tensor] = []
    seen_ops = {v[0]}
    seen_src: set[Tensor] = set()
    stack = [v[0]]
    while stack:
        i = stack.pop()
        ops.append(i)
        if len(ops) > _MAX_WALK:
            return None
        for s in index.data_inputs[i]:
            if s in held or stop(s[0]) is not None:
                if s not in seen_src:
                    seen_src.add(s)
                    sources.append(s)
            elif s[0] not in seen_ops:
                seen_ops.add(s[0])
                stack.append(s[0])
    return Rebuild(v, sources, ops)
