"""Which part of a training step each node belongs to, and what the backward pass keeps alive.

Backward ops are found from the graph, not from names alone: the ops in the gradient scopes
(`gradients*/`, `gradient_tape/`, or the user's `--backward-scope`) seed the region, and every
op downstream of them that computes on gradients joins it. Ops downstream of a variable write
are the optimizer. Forward ops are the data ancestors of the backward region that are neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import compress

from graphmem.errors import InputError
from graphmem.graph import dtypes
from graphmem.graph.index import (
    SHAPE_ONLY_OPS,
    V2_LOOP_OPS,
    VARIABLE_OPS,
    GraphIndex,
    Tensor,
)
from graphmem.graph.names import made_by_graphmem

DEFAULT_BACKWARD_SCOPES = (r"(^|/)gradients(_\d+)?/", r"(^|/)gradient_tape/")
# both defaults in one regex (one search per name; neither has a backreference or a flag)
_DEFAULT_SCOPES = re.compile("|".join(f"(?:{p})" for p in DEFAULT_BACKWARD_SCOPES))
_DEFAULT_PREFIXES = ("gradients/", "gradient_tape/")  # names these start with match them
_WRITE_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply", "Assign",
                   "ResourceScatter", "Scatter", "ResourceStridedSliceAssign",
                   "StridedSliceAssign")


def is_state_write(op: str) -> bool:
    return op.startswith(_WRITE_PREFIXES)


def _state_writes(ops: list[str], nodes) -> list[int]:
    """The ops of `nodes` that write state, each op type tested once."""
    writing = {op for op in {ops[i] for i in nodes} if is_state_write(op)}
    return [i for i in nodes if ops[i] in writing] if writing else []


_PARAMETER_OPS = VARIABLE_OPS | {"ReadVariableOp", "Const", "HostConst"}
_PARAMETER_OPS_OR_IDENTITY = _PARAMETER_OPS | {"Identity"}


def is_parameter_read(index: GraphIndex, i: int) -> bool:
    """Variables, their reads and constants: persistent memory, not activations."""
    op = index.ops[i]
    if op in _PARAMETER_OPS:
        return True
    ins = index.data_inputs[i]
    return op == "Identity" and len(ins) == 1 and index.ops[ins[0][0]] in VARIABLE_OPS


def parameter_reads(index: GraphIndex) -> set[int]:
    """Every op `is_parameter_read` holds for, asked only of the op types it can hold for
    (one scan of the ops, not one call per op)."""
    candidates = map(_PARAMETER_OPS_OR_IDENTITY.__contains__, index.ops)
    return {i for i in compress(range(len(index)), candidates) if is_parameter_read(index, i)}


@dataclass
class SavedActivation:
    """A forward tensor read by the backward pass: what stays in memory between the passes."""

    tensor: Tensor
    name: str
    shape: list[int] | None
    dtype: int | None
    bytes: int | None
    consumers: list[int]  # backward ops that read its data


@dataclass
class Regions:
    forward: set[int]
    backward: set[int]
    optimizer: set[int]
    state_updates: set[int]  # variable writes outside the optimizer (batch-norm moving averages)
    other: set[int]
    loss: list[Tensor]
    saved: list[SavedActivation] = field(default_factory=list)
    _step: tuple[int, set[int]] | None = field(default=None, repr=False, compare=False)

    @property
    def saved_bytes(self) -> int:
        return sum(s.bytes or 0 for s in self.saved)

    @property
    def unknown_size(self) -> list[SavedActivation]:
        return [s for s in self.saved if s.bytes is None]

    def step_nodes(self, index: GraphIndex) -> set[int]:
        """The ops one training step runs: everything the updates and the loss depend on."""
        if self._step is not None and self._step[0] == id(index):
            return self._step[1]  # asked by each estimate and pass: walk once per index
        roots = self.backward | self.optimizer | self.state_updates | {t[0] for t in self.loss}
        roots -= _left_unread(index, roots)
        step = index.ancestors(roots, data_only=False)
        self._step = (id(index), step)
        return step

    def region_of(self, i: int) -> str:
        for label, members in (("forward", self.forward), ("backward", self.backward),
                               ("optimizer", self.optimizer),
                               ("state_updates", self.state_updates)):
            if i in members:
                return label
        return "other"


# ops a pass leaves without readers when it replaces them (split_identityn.py: a
# gradient IdentityN; in_place_terms.py: a weight-decay sum; pool_first.py: a ReLU
# gradient, and with it the pooling gradient only it read)
_REPLACED_OPS = frozenset({"IdentityN", "AddN", "Add", "AddV2", "ReluGrad"})


def _left_unread(index: GraphIndex, roots: set[int]) -> set[int]:
    """Ops nothing reads that passes left behind (`_REPLACED_OPS` nothing reads by data or
    waits for), and the stateless ops only they read: TensorFlow prunes them (a session
    runs what is fetched, a function body what its results need), so they are no part of
    the step (kept, an unread IdentityN would read every gradient at the end and hold it
    alive in the estimate). One walk back from them: linear in what it removes."""
    stack = [i for i in roots if index.ops[i] in _REPLACED_OPS and not index.data_consumers(i)]
    if not stack:
        return set()
    unread: set[int] = set()
    while stack:
        i = stack.pop()
        if i in unread or index.control_consumers[i] or index.stateful[i] or \
                any(c not in unread for c in index.data_consumers(i)):
            continue
        unread.add(i)
        stack.extend(s for s, _ in index.data_inputs[i] if s in roots and s not in unread)
    return unread


def scope_matcher(scopes: tuple[str, ...] | list[str] | None):
    if not scopes:  # the defaults: a substring test first spares most names the regex, and
        # a name that starts with a default scope matches without it
        search = _DEFAULT_SCOPES.search
        return lambda name: "gradient" in name and (
            name.startswith(_DEFAULT_PREFIXES) or search(name) is not None)
    patterns = [re.compile(s) for s in scopes]
    return lambda name: any(p.search(name) for p in patterns)


def analyze_regions(index: GraphIndex, backward_scopes=None, batch_size: int | None = None,
                    loss_names: list[str] | None = None) -> Regions:
    """The walks below stop where the rest of the graph is known to add nothing to what is
    kept of their result (each such `stop` says why); the regions are those of the full
    walks."""
    n = len(index)
    in_scope = scope_matcher(backward_scopes)
    seeds = _backward_seeds(index, in_scope)
    if not seeds:
        raise InputError("found no backward ops (no gradients/ or gradient_tape/ scope); "
                         "is this a training graph? (name the scope with --backward-scope)")
    downstream = index.descendants(seeds, data_only=True)  # the seeds among them
    ops = index.ops
    writes = _state_writes(ops, downstream)
    # closed under descendants, as `downstream` is: every descendant of a backward op is
    # backward or optimizer, and of an optimizer op, optimizer
    optimizer = index.descendants(writes, data_only=False)
    backward = downstream - optimizer
    forward = index.ancestors(backward, data_only=True)
    forward -= backward
    forward -= optimizer
    params = parameter_reads(index)
    activations = [i for i in forward if i not in params]
    # descendants of backward ops are backward or optimizer, which every use of
    # fed_by_forward leaves out: stop at them
    fed_by_forward = index.descendants(activations, data_only=True, stop=backward)
    loss = _find_loss(index, forward, backward, optimizer, loss_names, fed_by_forward)
    # ancestors of forward ops are ancestors of the backward region, which are already
    # forward, backward or optimizer: stop at them
    more = index.ancestors([t[0] for t in loss], data_only=True, stop=forward)
    more -= backward
    more -= optimizer
    more -= forward
    forward |= more
    if more:  # the loss's own branch joins the forward pass: walk again from it
        more_acts = [i for i in more if i not in params]
        fed_by_forward |= index.descendants(more_acts, data_only=True, stop=backward)
    # writes fed by the forward pass outside the optimizer: batch-norm moving averages
    fed = fed_by_forward - forward - backward - optimizer
    writes_fed = _state_writes(ops, fed)
    # every op on a path from a `fed` op to one of these writes is in `fed` too (a forward
    # op on it would make the path's start forward, a backward or optimizer op its end), so
    # the walk up need not pass forward ops
    state_updates = index.ancestors(writes_fed, data_only=True, stop=forward) & fed
    forward -= state_updates
    factors = gradient_factors(index, forward, backward, optimizer, state_updates, loss,
                               params)
    forward -= factors
    backward |= factors
    other = set(range(n)).difference(forward, backward, optimizer, state_updates)
    regions = Regions(forward, backward, optimizer, state_updates, other, loss=loss)
    regions.saved = saved_activations(index, regions, batch_size, params)
    return regions


# inputs of the step: never gradient factors, whatever reads them
_STEP_INPUTS = frozenset({"Placeholder", "PlaceholderWithDefault", "_Arg"})


def gradient_factors(index: GraphIndex, forward: set[int], backward: set[int],
                     optimizer: set[int], state_updates: set[int], loss: list[Tensor],
                     params: set[int]) -> set[int]:
    """Forward ops that only the backward pass needs: terms of a gradient computed from
    forward values alone, before the incoming gradient multiplies them in. A custom
    gradient builds them (Keras' swish, `x * sigmoid(x)`: `sigmoid(x) * (1 + x * (1 -
    sigmoid(x)))`, several full-size tensors per layer); nothing the loss, a state update
    or the optimizer needs depends on them other than through backward ops.

    They are backward ops: TF runs them as soon as their forward inputs exist, and keeps
    what they make until the backward pass reaches their layer (Keras' EfficientNetB0 at
    224 px: every swish layer's terms live through the step). Counted as backward, their
    forward inputs are saved activations, which the recompute pass copies for them and so
    holds them back too. Ops in loop frames, stateful ops, parameter reads and the step's
    inputs stay where they are."""
    if not loss:
        return set()  # what the forward pass is for is unknown: nothing is told apart
    roots = [t[0] for t in loss]
    roots.extend(state_updates)
    roots.extend(optimizer)
    needed = index.ancestors(roots, stop=backward)
    out = {i for i in forward if i not in needed and i not in params
           and index.ops[i] not in _STEP_INPUTS and not index.stateful[i]
           and not index.in_loop(i) and not made_by_graphmem(index.names[i])}
    if not out:
        return out
    # computed from the step's data, not from variables alone (an optimizer's `momentum *
    # m`, which Keras' SGD computes before the gradient arrives, is the optimizer's): the
    # data comes from forward sources that read no tensor but a resource (a placeholder, a
    # function's argument, an iterator's next element)
    sources = [i for i in forward if i not in params and index.ops[i] != "Const"
               and not _resource(index, (i, 0))
               and all(_resource(index, t) for t in index.data_inputs[i])]
    return out & index.descendants(sources, data_only=True, stop=backward)


def _resource(index: GraphIndex, t: Tensor) -> bool:
    return index.dtype(t) == dtypes.RESOURCE


_ACCUMULATOR_OPS = frozenset({"EmptyTensorList", "TensorListReserve"})


def _backward_seeds(index: GraphIndex, in_scope) -> list[int]:
    """The ops of the gradient scopes, less the accumulators that the gradient made for the
    forward v2 loops (empty tensor lists the forward loop pushes its per-step values into,
    and the constants only they read). Those compute nothing on gradients; as seeds they
    would make each forward loop, and every forward op after it, backward."""
    scoped = list(compress(range(len(index)), map(in_scope, index.names)))
    ops = index.ops
    accumulators = {i for i in scoped if ops[i] in _ACCUMULATOR_OPS
                    and _forward_loop_accumulator(index, i, in_scope)}
    if not accumulators:
        return scoped
    only_for_them = {i for i in scoped if index.data_consumers(i)
                     and all(r in accumulators for r in index.data_consumers(i))}
    return [i for i in scoped if i not in accumulators and i not in only_for_them]


def _forward_loop_accumulator(index: GraphIndex, i: int, in_scope) -> bool:
    if index.ops[i] not in _ACCUMULATOR_OPS:
        return False
    readers = index.data_consumers(i)
    return bool(readers) and all(index.ops[r] in V2_LOOP_OPS and not in_scope(index.names[r])
                                 for r in readers)


def saved_activations(index: GraphIndex, regions: Regions, batch_size: int | None,
                      params: set[int] | None = None) -> list[SavedActivation]:
    """In topological order. Only the forward ops that a backward op reads are looked at:
    found from the backward region's inputs, far fewer than the ops of the graph.
    `params`: `parameter_reads(index)`, when the caller has it."""
    if params is None:
        params = parameter_reads(index)
    out = []
    backward, forward = regions.backward, regions.forward
    consumers, ops, num_outputs = index.consumers, index.ops, index.num_outputs
    data_inputs, data_consumers = index.data_inputs, index.data_consumers
    sizes = index.output_bytes(batch_size)  # the estimate asks for them too: one cache
    read = {s for c in backward if ops[c] not in SHAPE_ONLY_OPS for s, _ in data_inputs[c]}
    read &= forward
    read -= params
    for i in sorted(read, key=index.position.__getitem__):
        for k in range(num_outputs[i]):
            readers = None
            # one output: its readers are the op's (same order), without a tuple look-up
            for c in data_consumers(i) if num_outputs[i] == 1 else consumers.get((i, k), ()):
                if c in backward and ops[c] not in SHAPE_ONLY_OPS:
                    if readers is None:
                        readers = [c]
                    else:
                        readers.append(c)
            if readers is None:
                continue
            t = (i, k)
            out.append(SavedActivation(t, index.tensor_name(t), index.shape(t), index.dtype(t),
                                       sizes(i)[k], readers))
    return out


_SINK_READERS = frozenset({"_Retval", "ScalarSummary", "HistogramSummary", "Identity",
                           "NoOp"}) | SHAPE_ONLY_OPS
_NOT_LOSS_OPS = VARIABLE_OPS | (_SINK_READERS - {"Identity"})


def _find_loss(index: GraphIndex, forward: set[int], backward: set[int],
               optimizer: set[int], named: list[str] | None,
               fed_by_forward: set[int]) -> list[Tensor]:
    """The loss: a float scalar computed from the forward pass that nothing else reads.

    Among several such scalars (metrics, loss terms), the one the backward pass names as the
    start of a gradient (`gradients/<loss>_grad/`, `gradient_tape/<loss>/`) wins, else the
    last one. Without any, the names given (the `losses` collection, which in TF1 lists terms
    rather than their sum); without those, a scalar read only outside the forward and
    backward passes (a Keras train step feeds its loss to a `Mean` metric's update) whose
    inputs the backward pass reads.
    """
    after = fed_by_forward - backward - optimizer
    strict, relaxed = [], []
    ops, data_inputs, consumers = index.ops, index.data_inputs, index.consumers
    # the readers first: most ops have a forward reader, and shapes cost a parse. Those
    # are found from the forward ops' inputs (one look-up of an op's readers costs more);
    # the few left are taken in topological order
    read_by_forward = {s for f in forward for s, k in data_inputs[f] if not k}
    candidates = [i for i in after if i not in read_by_forward and data_inputs[i]
                  and ops[i] not in _NOT_LOSS_OPS]
    for i in sorted(candidates, key=index.position.__getitem__):
        readers = consumers.get((i, 0), ())
        sinks_only = all(ops[r] in _SINK_READERS for r in readers)
        if not sinks_only and any(r in backward for r in readers):
            continue
        if index.shape((i, 0)) == [] and index.dtype((i, 0)) in _FLOAT_TYPES:
            (strict if sinks_only else relaxed).append((i, 0))
    if len(strict) == 1:
        return strict  # the only one, whichever gradient names it
    if strict:
        graded = _gradient_targets(index, backward)
        return ([t for t in strict if index.names[t[0]] in graded] or strict)[-1:]
    named_found = [t for t in (index.tensor(n) for n in named or []) if t is not None]
    if named_found or not relaxed:
        return named_found
    # a loss the backward pass differentiates: its gradient reads what the loss op read
    # (a metric computed from the loss does not qualify: the backward pass reads none of
    # its inputs)
    succ = index.data_consumers
    at_edge = [t for t in relaxed
               if any(c in backward for s, _ in index.data_inputs[t[0]] for c in succ(s))]
    return at_edge[-1:]


def _gradient_targets(index: GraphIndex, backward: set[int]) -> set[str]:
    """Forward op names that gradient scopes are named after: TF1's
    `gradients/<op>_grad/...`, and a tape's `gradient_tape/<op>/<gradient op>` (every
    prefix of the rest, since op names hold slashes)."""
    out = set()
    for i in backward:
        name = index.names[i]
        cut = name.find("_grad/")
        if cut > 0:
            head = name[:cut]
            slash = head.find("/")
            out.add(head[slash + 1:] if slash >= 0 else head)
            continue
        tape = name.find("gradient_tape/")
        if tape >= 0:
            parts = name[tape + len("gradient_tape/"):].split("/")
            for k in range(1, len(parts)):
                out.add("/".join(parts[:k]))
    return out


_FLOAT_TYPES = dtypes.FLOATS
