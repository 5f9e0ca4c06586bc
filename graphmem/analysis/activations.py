"""Which forward ops compute activations, and which of those may be recomputed.

An activation op computes on the step's data (it depends on an input such as a placeholder,
not only through shape-only ops) and is not a parameter read. Recomputable activation ops are
the ones a copy of which yields the same values at any later time: no state, no randomness,
no control flow, no direct read of a ref variable (its buffer changes when the optimizer runs).
A v2 loop op whose functions only read state may be replayed as a whole when asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions, is_parameter_read
from graphmem.graph import dtypes
from graphmem.graph.index import SHAPE_ONLY_OPS, VARIABLE_OPS, GraphIndex

INPUT_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
                       "IteratorGetNext", "IteratorGetNextSync", "QueueDequeue",
                       "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
                       "QueueDequeueUpTo", "QueueDequeueUpToV2"})
_UNSAFE_DTYPES = frozenset({dtypes.RESOURCE, dtypes.VARIANT, dtypes.STRING})


@dataclass
class ForwardFacts:
    activation: set[int]  # forward ops computing on the step's data
    param_dependent: set[int]  # activation ops downstream of a parameter (the model's spine)
    recomputable: set[int]
    blocked: dict[int, str] = field(default_factory=dict)  # activation op -> why it is kept


def is_data_input(index: GraphIndex, i: int) -> bool:
    op = index.ops[i]
    if op in INPUT_OPS:
        return True
    if op == "_Arg":
        return index.node(i).attr["T"].type not in (dtypes.RESOURCE, dtypes.VARIANT)
    return False


def analyze_forward(index: GraphIndex, regions: Regions,
                    replayable: set[int] = frozenset()) -> ForwardFacts:
    """`replayable`: v2 loop ops that may be recomputed as a whole (see
    analysis/replayable_loops.py); every other loop or conditional is kept."""
    forward = regions.forward
    on_data: set[int] = set()
    on_param: set[int] = set()
    for i in index.topo:
        if i not in forward:
            continue
        if is_data_input(index, i):
            on_data.add(i)
            continue
        if index.ops[i] in VARIABLE_OPS or is_parameter_read(index, i):
            on_param.add(i)
            continue
        if index.ops[i] in SHAPE_ONLY_OPS:
            continue
        ins = [s for s, _ in index.data_inputs[i]]
        if any(s in on_data for s in ins):
            on_data.add(i)
        if any(s in on_param for s in ins):
            on_param.add(i)
    activation = on_data
    blocked: dict[int, str] = {}
    recomputable: set[int] = set()
    for i in activation:
        why = _why_not_replayable(index, i) if i in replayable else \
            _why_not_recomputable(index, i)
        if why:
            blocked[i] = why
        else:
            recomputable.add(i)
    return ForwardFacts(activation, activation & on_param, recomputable, blocked)


def _why_not_replayable(index: GraphIndex, i: int) -> str | None:
    """A loop whose functions only read state: its variable inputs are read inside, and its
    tensor-list outputs are what the gradient loop reads."""
    for s, k in index.data_inputs[i]:
        dt = index.dtype((s, k))
        if dt is not None and dtypes.is_ref(dt):
            return "reads a ref variable"
    return None if index.out_dtypes[i] is not None else "unknown output types"


def _why_not_recomputable(index: GraphIndex, i: int) -> str | None:
    op = index.ops[i]
    if is_data_input(index, i):
        return "input"
    if index.is_control_flow(i) or index.in_loop(i):
        return "control flow (loops and conditionals are kept whole)"
    if index.stateful[i]:
        return "stateful (random, variable read or queue)"
    for s, k in index.data_inputs[i]:
        dt = index.dtype((s, k))
        if dt is not None and dtypes.is_ref(dt):
            return "reads a ref variable"
        if index.ops[s] in VARIABLE_OPS:
            return "reads a variable"
    types = index.out_dtypes[i]
    if types is None:
        return "unknown output types"
    if any(dtypes.base(t) in _UNSAFE_DTYPES for t in types):
        return "outputs handles or variants"
    if op.startswith("_") and op not in ("_FusedMatMul", "_FusedConv2D", "_MklMatMul"):
        return "internal op"
    return None
