"""Early updates: let each optimizer update run as soon as its gradient is ready.

TF's executor runs the backward chain depth first, so the weight-gradient updates it readies
on the way wait until the chain ends, and every weight gradient stays alive until then: for
MLPs and transformers that is often the step's peak. This pass adds a control edge from each
update to the backward ops one step further down the chain (the readers of the gradient's
siblings, in the gradient scope), so the chain cannot run ahead of the updates.

An update's gradient is found by walking up from the write through the backward and
optimizer regions to the gradient scope: TF1 optimizers read it directly; Keras (TF2)
optimizers compute the moments on it, write the slots, read them back and then write the
variable. A Keras optimizer's `IdentityN` over all gradients is split first
(passes/split_identityn.py), or no update could start before the last gradient.

With several towers (data-parallel replicas, analysis/towers.py) an update reads the
average of the towers' gradients of its weight (`add_n(...) / n` on the parameter device):
it waits for that average, and each tower's chain continues past its own gradient only
after the update, so no tower runs ahead while the gradients pile up. An update whose
gradient comes from a collective op (an all-reduce) is left alone: its edges would order
that collective before the next layer's, and every replica must issue them in one order.

Only the order changes, never a value. Edges only add order, so every access of a variable
the graph orders before or after a write stays so; a write is moved only when every access
of its variable (reads and other writes in the step) is ordered one way or the other with
it, and so is every state write it waits for (the Adam slots a Keras update reads back).
A resource variable updated while a read's tensor is still referenced is copied first, so
each update also waits for the backward readers of its variable's value (the `dx` matmul).
An edge is only added where it provably cannot close a cycle. These are reachability
questions between an update and a few ops near it, answered without per-update sets over
the whole graph (one bit per update per op grows as nodes x updates: 16 GB at a million
nodes):

- an op placed after the update in topological order cannot be its ancestor;
- the rest is asked of a reachability index (graph/reachability.py): interval labels answer
  most "no"s, landmarks (the loss, the last forward ops the backward pass reads) the long
  "yes"es from forward reads, and short searches with a visit budget the rest; past the
  budget the answer is the safe one (skip the update, or drop the edge).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.broadcast_grads import REDUCTION_OPS
from graphmem.analysis.kernel_fusions import in_merged_chain
from graphmem.analysis.regions import Regions, is_parameter_read, is_state_write, scope_matcher
from graphmem.analysis.towers import is_collective
from graphmem.graph.devices import normalize_device
from graphmem.graph.index import SHAPE_ONLY_OPS, VARIABLE_OPS, GraphIndex, closing_cycles
from graphmem.graph.reachability import Reachability
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan, skip


@dataclass
class EarlyUpdatesPlan(PassPlan):
    updates: int = 0  # updates that got edges
    edges: int = 0
    covered: int = 0  # writes moved by a later update's edges (Keras Adam slots)
    split_identityn: list[str] = field(default_factory=list)  # gradient barriers split first
    release_edges: int = 0  # edges from a variable value's last readers into its update
    held_back: int = 0  # products of slots alone (RMSprop's rho * v) made to wait for the gradient
    handle_edges: int = 0  # slot handles made to run in the forward pass (_early_handles)
    skipped: dict[str, int] = field(default_factory=dict)  # why -> updates
    late_terms: int = 0  # weight-decay terms made to wait for their gradient (late_terms.py)
    late_term_bytes: int = 0
    loop_sums_held: int = 0  # v1 gradient-loop terms made to wait for their sum (loop_sums.py)
    last_readers: int = 0  # tensors an element-wise reader now writes in place (last_readers.py)
    last_reader_bytes: int = 0
    # (the last five and split_identityn are the schedule passes' results, which the
    # report presents with this plan: the driver fills them in)

    @property
    def changed(self) -> bool:
        return self.updates > 0 or self.release_edges > 0 or self.held_back > 0

    @property
    def skipped_reasons(self) -> dict[str, int]:
        return dict(self.skipped)


@dataclass
class _Update:
    """An optimizer write and what the walk up from it found: the gradient op it depends on
    and the other state writes it waits for (Keras writes the Adam slots first, then reads
    them back for the variable's update)."""
    op: int
    gradient: int | list[int]  # several: one per tower, averaged (`_tower_gradients`)
    writes: list[int]
    slot_products: list[int] = field(default_factory=list)


def apply_early_updates(index: GraphIndex, regions: Regions,
                        checkpoints: list[int] = (), backward_scopes=None,
                        batch_size: int | None = None) -> EarlyUpdatesPlan:
    """Add the edges to the graph and to `index` (no re-index needed). `checkpoints`: the
    forward ops a recompute pass kept, which the rewritten backward pass reads (landmarks
    for the ordering questions); `batch_size` sizes the ops that would wait (a reduction
    passes its wait on to its readers: `_past_reduction`)."""
    plan = EarlyUpdatesPlan()
    sizes = index.output_bytes(batch_size)
    in_scope = scope_matcher(backward_scopes)
    updates: list[_Update] = []
    for i in sorted(regions.optimizer, key=index.position.__getitem__):
        if not is_state_write(index.ops[i]):
            continue
        found = _gradient_of(index, i, regions, in_scope)
        if found is _NO_GRADIENT:
            continue  # not a gradient's update (an iteration count, a beta power)
        if found is _SEVERAL_GRADIENTS:
            # waits for several gradients (Adam's beta powers, a global-norm clip): it
            # cannot run before the last of them anyway
            skip(plan, "waits for several gradients")
            continue
        if found is None:
            skip(plan, "gradient not found within the search budget")
            continue
        if found is _COLLECTIVE:
            # its edges would order the collective before the next layer's: replicas must
            # issue collectives in one order, which the graph alone does not fix
            skip(plan, "its gradient comes from a collective op")
            continue
        updates.append(_Update(i, *found))
    if not updates:
        return plan
    step = regions.step_nodes(index)
    reach = Reachability(index, _landmarks(index, regions, checkpoints))
    verdicts: dict[int, str | None] = {}  # write -> why it must not move (None: it may)

    def verdict(w: int) -> str | None:
        if w not in verdicts:
            verdicts[w] = _why_not_movable(index, reach, step, w)
        return verdicts[w]

    chosen: dict[int, list[int]] = {}  # update -> backward ops that wait for it
    # the backward ops the step runs (a sum in_place_terms.py replaced, and its term, are
    # left unread: an edge into them would order nothing)
    backward = regions.backward & step
    for u in updates:
        a = u.op
        # moving `a` earlier moves the writes it waits for too: each must be safe to move
        why = verdict(a) or next((verdict(w) for w in u.writes if verdict(w)), None)
        if why is not None:
            skip(plan, why)
            continue
        # an edge a -> x closes a cycle when a depends on x; an op placed after a cannot
        # be its ancestor, and inside a loop body the test ignores back edges: skip those
        chain = [y for g in _gradients(u) for x in
                 _next_in_chain(index, g, a, backward, in_scope)
                 for y in _past_reduction(index, sizes, backward, x)]
        targets = [x for x in dict.fromkeys(chain) if not index.in_loop(x)
                   and (index.position[x] > index.position[a] or reach.reaches(x, a) is False)]
        if not targets:
            skip(plan, "no backward op after the gradient")
            continue
        chosen[a] = targets
    # a write another chosen update waits for (a Keras Adam slot) runs before that update's
    # edges anyway: its own edges would only repeat them
    waited_for = {w for u in updates if u.op in chosen for w in u.writes}
    for u in updates:
        if u.op in chosen and u.op in waited_for:
            del chosen[u.op]
            plan.covered += 1
    # each update's edges: out to the backward ops that wait for it, and in from the last
    # readers of its variable's value
    by_op = {u.op: u for u in updates}
    edges = {a: [(a, x) for x in targets] + [(c, a) for c in _value_readers(index, reach, step, a)]
             + [(g, p) for g in _gradients(by_op[a]) for p in by_op[a].slot_products
                if index.position[p] > index.position[g] or reach.reaches(p, g) is False]
             + _early_handles(index, regions, a)
             for a, targets in chosen.items()}
    for a in [a for a, a_edges in edges.items()
              if any(index.may_be_dead(u) for u, _ in a_edges)]:
        # a control edge from an op in a tf.cond branch (v1) would make the update dead
        # whenever that branch is not taken
        del edges[a]
        skip(plan, "it would wait for an op in a conditional branch")
    for a in closing_cycles(index, edges):
        del edges[a]
        skip(plan, "its edges would close a cycle with another update's")
    added = [e for a_edges in edges.values() for e in a_edges]
    for u, v in added:
        index.graph_def.node[v].input.append("^" + index.names[u])
    index.add_control_edges(added)
    plan.updates = len(edges)
    plan.release_edges = sum(1 for _, v in added if v in edges)
    plan.handle_edges = sum(1 for u, v in added if u not in edges and v not in edges and
                            index.ops[u] in VARIABLE_OPS)
    plan.held_back = sum(1 for u, v in added if u not in edges and v not in edges and
                         index.ops[u] not in VARIABLE_OPS)
    plan.edges = len(added) - plan.release_edges - plan.held_back - plan.handle_edges
    return plan


def _gradients(u: _Update) -> list[int]:
    return u.gradient if isinstance(u.gradient, list) else [u.gradient]


_NO_GRADIENT = object()
_SEVERAL_GRADIENTS = object()
_COLLECTIVE = object()
_WALK_BUDGET = 256  # ops expanded per update; a Keras Adam update is about 20 away


def _gradient_of(index: GraphIndex, a: int, regions: Regions, in_scope):
    """Walk up from update `a` through the backward and optimizer regions (data and control
    inputs) to the ops of the gradient scope. Returns (gradient op, state writes passed on
    the way), `_NO_GRADIENT` when no gradient feeds the update, `_SEVERAL_GRADIENTS` when
    several do (a global-norm clip: no early update), or None when the walk ran past its
    budget."""
    backward, optimizer = regions.backward, regions.optimizer
    data_inputs, control_inputs, names = index.data_inputs, index.control_inputs, index.names
    for s, _ in data_inputs[a]:  # TF1 optimizers read the gradient directly
        if is_collective(index.ops[s]):
            return _COLLECTIVE
        if s in backward and in_scope(names[s]):
            return _through_identities(index, s, backward), [], []
    stack, seen = [a], {a}
    gradients: set[int] = set()
    writes: list[int] = []
    products: list[int] = []
    expanded = 0
    while stack:
        i = stack.pop()
        expanded += 1
        if expanded > _WALK_BUDGET:
            return None
        for s in [s for s, _ in data_inputs[i]] + control_inputs[i]:
            if s in seen:
                continue
            seen.add(s)
            if is_collective(index.ops[s]):
                return _COLLECTIVE
            if s in backward and in_scope(names[s]):
                gradients.add(_through_identities(index, s, backward))
            elif s in backward or s in optimizer:
                if is_state_write(index.ops[s]):
                    writes.append(s)
                stack.append(s)
            elif _is_slot_product(index, s):
                products.append(s)
    if not gradients:
        return _NO_GRADIENT
    if len(gradients) > 1:
        towers = _tower_gradients(index, sorted(gradients, key=index.position.__getitem__))
        if towers is None:
            return _SEVERAL_GRADIENTS
        return towers, writes, products
    return gradients.pop(), writes, products


def _tower_gradients(index: GraphIndex, gradients: list[int]) -> list[int] | None:
    """The gradients of one weight made by several towers (data-parallel replicas), one per
    device, that the update reads averaged (`add_n(tower grads) / n`): the update's
    gradient is their average, ready when the last of them arrives. None for gradients
    that are not one per device (a global-norm clip reads every gradient of one tower)."""
    devices = [normalize_device(index.devices[g]) for g in gradients]
    if "" in devices or len(set(devices)) != len(devices):
        return None
    return gradients


_SLOT_PRODUCT_ELEMENTS = 1024


def _is_slot_product(index: GraphIndex, s: int) -> bool:
    """An op computed from variables and constants alone, as large as a weight (RMSprop's
    `rho * velocity`, a hand-written momentum's `mu * v`). Ready when the step starts, it
    is run whenever the executor finds nothing else to do, which early updates make happen
    mid-step: then every layer's product is made at once and held until its gradient
    arrives. Made to wait for its update's gradient, it lives a moment instead."""
    if index.in_loop(s) or is_parameter_read(index, s) or index.ops[s] in VARIABLE_OPS:
        return False
    ins = index.data_inputs[s]
    if not ins or not all(is_parameter_read(index, t) for t, _ in ins):
        return False
    shape = index.shape((s, 0))
    if not shape or any(d is None or d < 0 for d in shape):
        return False
    elements = 1
    for d in shape:
        elements *= d
    return elements >= _SLOT_PRODUCT_ELEMENTS


def _why_not_movable(index: GraphIndex, reach: Reachability, step: set[int],
                     a: int) -> str | None:
    """Moving write `a` earlier (adding edges only) keeps every order the graph already
    fixes; it can change a value only through an access of the same variable that is
    ordered neither before nor after it. None when there is no such access."""
    variable = _variable_of(index, a)
    if variable is None:
        return "variable not found"
    if index.in_loop(a):
        return "inside a loop"
    for r in _accesses_of(index, variable, a):
        if r not in step:
            continue
        before = reach.reaches(r, a)
        if before:
            continue
        after = reach.reaches(a, r) if before is False else None
        if after:
            continue
        if before is None or after is None:
            return "ordering not settled within the search budget"
        return "a read of the variable is not ordered before or after the update"
    return None


def _value_readers(index: GraphIndex, reach: Reachability, step: set[int],
                   a: int) -> list[int]:
    """Readers of the variable's value that the update does not wait for yet (the backward
    `dx = dy . W^T` matmul reading the forward read of W). A resource variable updated
    while a read's tensor is still referenced is copied first (copy on write), so an update
    running before them costs a transient copy of the variable: wait for them.

    A ref variable (TF1) is updated in place, and its read aliases its buffer, so a reader
    running after the update would read the new value. Every reader the graph orders
    before the update does so through the loss, and for some only through the gradient's
    seed, `Fill(Shape(loss))`: Grappler folds the shape of a scalar to a constant, and the
    order goes with it (tf-slim Inception v3: the weight-decay `L2Loss` of a weight updated
    early read the updated weight, and the step's loss moved by a rounding step). So an
    update of a ref variable waits for every reader of its value explicitly.

    Only readers that provably do not depend on the update (no cycle), and that the step
    runs (an edge from an op a pass left unread would make TF run it again)."""
    variable = _variable_of(index, a)
    if variable is None:
        return []
    ref = index.ops[variable] not in ("_Arg", "VarHandleOp")
    out = []
    for r in _accesses_of(index, variable, a):
        if index.ops[r] not in ("ReadVariableOp", "Identity") or index.in_loop(r):
            continue
        if reach.reaches(r, a) is not True:
            continue  # reads after the update (Keras Adam's slot reads) see the new value
        for c in index.data_consumers(r):
            if index.in_loop(c) or index.ops[c] in ("Identity", "ReadVariableOp") or \
                    c not in step:
                continue
            if index.position[c] > index.position[a] and reach.reaches(a, c) is not False:
                continue  # c may depend on the update: an edge c -> a could close a cycle
            if not ref and in_merged_chain(index, c):
                # an edge out of it would keep TF from merging it with its producer or
                # reader (a dense layer's MatMul and BiasAdd), and the unmerged pair
                # rounds otherwise; the edge only saves a copy of the variable
                continue
            if reach.reaches(c, a) is False or (ref and reach.reaches(a, c) is False):
                out.append(c)
    return sorted(set(out))


def _early_handles(index: GraphIndex, regions: Regions, a: int) -> list[tuple[int, int]]:
    """Edges that run the update's slot handles during the forward pass.

    A TF1 slot variable's handle (`VarHandleOp`, `VariableV2`) is a root of the step that
    only its update reads. TF queues the step's roots once, at its start, behind the work
    that runs first, so such a handle can run last of all: seen on tf-slim AlexNet at one
    inter-op thread, in one process of four the Momentum slot's handle of fc7 ran at the end
    of the step, fc7's update waited for it, and its 64 MiB gradient stayed alive through
    fc6's backward pass (250 against 128 MiB). An edge from each such handle to the first
    forward read of the update's own variable makes that read wait for it, so it runs in
    the forward pass (a trivial op); the init and save ops never run forward reads, so
    they do not wait for anything new."""
    variable = _variable_of(index, a)
    if variable is None:
        return []
    reads = [r for r in _accesses_of(index, variable, a) if r in regions.forward]
    if not reads:
        return []
    first = min(reads, key=index.position.__getitem__)
    out = []
    for s, _ in index.data_inputs[a][1:]:
        if index.ops[s] in VARIABLE_OPS and not index.data_inputs[s] and \
                not index.control_inputs[s] and s not in index.control_inputs[first] and \
                (s, first) not in out:
            out.append((s, first))
    return out


def _landmarks(index: GraphIndex, regions: Regions, checkpoints: list[int]) -> list[int]:
    """Ops that forward reads of weights reach and that reach the updates: the last
    checkpoints a recompute pass kept (the rewritten backward pass starts from them), the
    last forward ops on the loss's path that the backward pass reads (the cross entropy, the
    logits), and the loss with its inputs. Eight at most (Reachability's limit)."""
    position = index.position.__getitem__
    loss_nodes = [t[0] for t in regions.loss]
    on_loss_path = index.ancestors(loss_nodes, data_only=True) if loss_nodes else set()
    read = sorted({s.tensor[0] for s in regions.saved if s.tensor[0] in on_loss_path},
                  key=position)
    near_loss = loss_nodes + [s for i in loss_nodes for s, _ in index.data_inputs[i]]
    found = sorted(checkpoints, key=position)[-3:] + read[-3:] + near_loss
    return list(dict.fromkeys(found))[:8]


def _through_identities(index: GraphIndex, i: int, backward: set[int]) -> int:
    """The op behind Identity ops, and behind a weight-decay term added in place
    (in_place_terms.py: Reshape, InplaceAdd pieces, Reshape), which hand on the gradient's
    own buffer: the update's gradient is the layer's, as before the term was added."""
    while index.data_inputs[i] and index.data_inputs[i][0][0] in backward and (
            index.ops[i] in ("Identity", "InplaceAdd") or _in_place_reshape(index, i)):
        i = index.data_inputs[i][0][0]
    return i


def _in_place_reshape(index: GraphIndex, i: int) -> bool:
    """A Reshape at either end of an in-place chain: of an InplaceAdd's result, or read
    only as the tensor an InplaceAdd adds into."""
    if index.ops[i] != "Reshape":
        return False
    src = index.data_inputs[i][0][0]
    if index.ops[src] == "InplaceAdd":
        return True
    readers = index.consumers.get((i, 0), [])
    return len(readers) == 1 and index.ops[readers[0]] == "InplaceAdd" and \
        index.data_inputs[readers[0]][0] == (i, 0)


def _readers_past_identities(index: GraphIndex, i: int, backward: set[int],
                              in_scope) -> list[int]:
    """Backward readers of op i, past Identity ops. Only ops of the gradient scope, or
    ops that feed it (a `tf.custom_gradient` function's ops are named outside the tape's
    scope, between two of its ops): the optimizer's own arithmetic on a gradient (Keras
    computes Adam's moments before the write) is in the backward region too, and an edge
    into another update's arithmetic would make two updates wait for each other."""
    out = []
    for c in index.data_consumers(i):
        if c not in backward:
            continue
        if index.ops[c] == "Identity":
            out.extend(_readers_past_identities(index, c, backward, in_scope))
        elif in_scope(index.names[c]) or any(
                in_scope(index.names[d]) for d in index.data_consumers(c) if d in backward):
            out.append(c)
    return out


def _next_in_chain(index: GraphIndex, core: int, a: int, backward: set[int],
                   in_scope) -> list[int]:
    """Readers of the outputs of the gradient op's siblings: the ops that continue the
    backward chain past the point where the update's gradient `core` was made. A gradient
    op with several outputs and no sibling (a fused batch norm's gradient makes dx, dgamma
    and dbeta at once) is continued by the readers of its own other outputs; a gradient
    made by a short private chain (Keras batch norm: Mul -> Sum -> Reshape) is continued
    from where that chain leaves the shared gradient."""
    out: set[int] = set()
    chain = [core]  # the gradient's private chain, one level at a time
    members = {core}
    for _ in range(_CHAIN_LEVELS):
        ups = list(dict.fromkeys(u for c in chain for u, _ in index.data_inputs[c]
                                 if u in backward and u not in members
                                 and index.ops[u] not in _NOT_GRADIENTS))
        for up in ups:
            for sibling in index.data_consumers(up):
                if sibling in members or sibling not in backward:
                    continue
                out.update(_readers_past_identities(index, sibling, backward, in_scope))
        if not out:
            for c in chain:
                if index.num_outputs[c] > 1:
                    out.update(_readers_past_identities(index, c, backward, in_scope))
        # one level up through the sources that feed nothing but the chain: a weight's
        # gradient summed with its weight-decay term (`AddN` of the filter gradient and
        # the regularizer's, both behind `tuple` Identities) has two private sources
        members.update(ups)
        chain = [u for u in ups if all(c in members for c in index.data_consumers(u))]
        if out or not chain:
            break
    out -= members
    out.discard(a)
    return sorted(out)


def _past_reduction(index: GraphIndex, sizes, backward: set[int], x: int) -> list[int]:
    """The ops that wait for an update in place of x: x itself, or, when x reduces a large
    input to a small result (a batch norm's `Sum` of `dy * x`, its scale's gradient), the
    backward ops that read x. Running a reduction frees its input and allocates almost
    nothing, so making it wait only holds the input (a full-size activation gradient)
    through the update's chain; its readers hold the chain back as well."""
    if index.ops[x] not in REDUCTION_OPS and index.ops[x] != "BiasAddGrad":
        return [x]
    out = [b for b in sizes(x) if b is not None]
    largest = max((sizes(s)[k] or 0 for s, k in index.data_inputs[x]), default=0)
    readers = [c for c in index.data_consumers(x) if c in backward]
    if not readers or len(out) != len(sizes(x)) or sum(out) * _SHRINK > largest:
        return [x]
    return readers


_SHRINK = 16  # a reduction whose result is at most 1/16 of its input
_CHAIN_LEVELS = 8  # levels of a gradient's private chain walked up (Keras BN: 3)
_NOT_GRADIENTS = SHAPE_ONLY_OPS | {"Const", "HostConst"}  # shape inputs of a Reshape, ...


def _variable_of(index: GraphIndex, a: int) -> int | None:
    if not index.data_inputs[a]:
        return None
    s = index.data_inputs[a][0][0]  # updates take the variable (ref or handle) first
    return s if index.ops[s] in VARIABLE_OPS or index.ops[s] == "_Arg" else None


def _accesses_of(index: GraphIndex, variable: int, a: int) -> list[int]:
    """Every op that reads the variable's value (through Identity chains) or writes it,
    the update itself aside."""
    ops, data_consumers = index.ops, index.data_consumers
    accesses, stack = [], list(data_consumers(variable))
    seen = set(stack)
    while stack:
        c = stack.pop()
        if c == a:
            continue
        accesses.append(c)
        if ops[c] in ("Identity", "RefIdentity"):
            for d in data_consumers(c):
                if d not in seen:
                    seen.add(d)
                    stack.append(d)
    return accesses


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class EarlyUpdatesPass(Pass):
    """Each optimizer update runs as soon as its gradient is ready."""

    name, edits = "early updates", Edits.CONTROL_EDGES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> EarlyUpdatesPlan:
        index = context.index
        kept = [index.id_of[name.rsplit(":", 1)[0]] for name in context.checkpoints
                if name.rsplit(":", 1)[0] in index.id_of]
        return apply_early_updates(index, context.regions, kept,
                                   context.options.backward_scopes, context.options.batch_size)
