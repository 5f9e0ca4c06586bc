"""Sums and products that Grappler regroups, and so rounds differently, when a session starts.

Why it matters: Grappler's arithmetic optimizer collects a tree of `Mul` ops
(MinimizeBroadcasts) or of `Add`/`AddV2`/`AddN` ops (AddOpsRewrite) whose inner ops each
have one reader, and rebuilds it with the operands sorted by shape. Float multiplication
and addition are not associative, so the rebuilt tree rounds differently from the tree as
written, and TF trains with the rebuilt one. Both stages leave out an op that has a control
input or output (and AddOpsRewrite a root that has one). An ordering edge that a pass adds
to an op of such a tree therefore changes what TF computes by a rounding step: on Keras
MobileNetV2, an early update's edge from the last batch norm's scale gradient
(`Mul(AddN, Rsqrt)`) kept Grappler from regrouping it with the optimizer's `grad * lr`.
The momentum differed in its last bit from the first step, the weights from step 52, the
loss from step 55. With Grappler off the same graph trained bit for bit.

`regrouped_trees` finds, in the graph as the user wrote it, the trees Grappler may rebuild
in a different order; passes/regroup_guard.py then keeps the rewrite's edges off their
ops. The model is a superset of Grappler's conditions where it is unsure (unknown shapes,
preserved fetches): guarding a tree Grappler leaves alone only costs an ordering edge.
A tree whose operands all have one shape and that is summed left to right is left out:
MinimizeBroadcasts skips one shape, and AddOpsRewrite's `AddN` of the operands in order
adds them in the same order as the tree.
Cost: one pass over the nodes, and a walk up each tree from its root.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass

from graphmem.analysis.pruning import kept_by_grappler, unread_ops
from graphmem.graph import dtypes
from graphmem.graph.index import SHAPE_ONLY_OPS, GraphIndex, Tensor

MUL = "mul"
ADD = "add"
_FAMILY = {"Mul": MUL, "Add": ADD, "AddV2": ADD, "AddN": ADD}
# a float division by a constant: a product once Grappler folds constants (family)
DIVISIONS = frozenset({"RealDiv", "Div"})
# ops Grappler's pruner removes before the arithmetic optimizer runs (their readers then
# read their input), when they have no control edges
FORWARDERS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot"})
MAX_FORWARDERS = 8


@dataclass
class RegroupedTree:
    """A tree of one family's ops that Grappler may rebuild in another order."""

    family: str  # MUL or ADD
    root: int  # the op whose result the tree computes
    members: list[int]  # the inner ops Grappler folds into the root's group
    forwarders: list[int]  # Identity-like ops between a member and its reader

    @property
    def inner(self) -> list[int]:
        """The ops whose result must keep its one reader: a second one (a recompute copy
        reading a checkpoint there) takes the op out of the tree, and TF sums the rest in
        another order."""
        return [*self.members, *self.forwarders]

    @property
    def control_free(self) -> list[int]:
        """The ops that must carry no control edge: the inner ones, and a sum's root."""
        return [*self.inner, self.root] if self.family == ADD else self.inner


def inner_roots(trees: list[RegroupedTree]) -> dict[int, int]:
    """Each inner op of `trees` -> the root of its tree."""
    return {op: tree.root for tree in trees for op in tree.inner}


def family(index: GraphIndex, i: int) -> str | None:
    """MUL or ADD for a float multiply or sum op, else None (integer ops are exact). A
    float division by a constant is a product: Grappler's constant folding makes it one
    (by the constant's reciprocal) before its arithmetic optimizer runs."""
    f = _FAMILY.get(index.ops[i])
    if f is None:
        if index.ops[i] not in DIVISIONS or len(index.data_inputs[i]) != 2 or \
                index.ops[index.data_inputs[i][1][0]] != "Const":
            return None
        f = MUL
    dtype = index.dtype((i, 0))
    return f if dtype is None or dtypes.base(dtype) in dtypes.FLOATS else None


def dead_ops(index: GraphIndex) -> set[int]:
    """Ops whose results nothing that runs reads (analysis/pruning.py): TF prunes them
    before Grappler's arithmetic optimizer counts an op's readers (the gradient of
    `x / 6` with respect to the 6 reads `x`'s gradient, and nothing reads it)."""
    if not any(n == 0 or op == "_Retval" for n, op in zip(index.num_outputs, index.ops,
                                                          strict=True)):
        return set()  # no train op, update or function result: nothing is known to run
    return unread_ops(index, set(range(len(index))), ())


def live_reads(index: GraphIndex, t: Tensor, dead: Set[int] = frozenset()
               ) -> list[tuple[int, int]]:
    """(reader, input position) of each read of tensor t, less those of a forwarder whose
    output nothing reads (Grappler prunes them; an IdentityN hands input k to output k)
    and those of shape-only ops: the `Shape` a sum's gradient reads for its
    `BroadcastGradientArgs` is folded away by Grappler's first round when both operands
    have one shape, and its arithmetic optimizer's second round then folds the op into
    its reader's tree (Keras NASNetMobile: a batch norm's `add_1`, read by a cell's add).
    Where the shape reader stays, the tree is one Grappler leaves alone: guarding it
    only costs an ordering edge."""
    reads = []
    for r in dict.fromkeys(index.consumers.get(t, [])):
        if index.ops[r] in SHAPE_ONLY_OPS or r in dead:
            continue
        for p, s in enumerate(index.data_inputs[r]):
            if s == t and not _dead_output(index, r, p):
                reads.append((r, p))
    return reads


def _dead_output(index: GraphIndex, r: int, p: int) -> bool:
    if index.ops[r] not in FORWARDERS or index.control_consumers[r]:
        return False
    return not index.consumers.get((r, p if index.ops[r] == "IdentityN" else 0))


def reader_through_forwarders(index: GraphIndex, t: Tensor, free: bool = True,
                              dead: Set[int] = frozenset()
                              ) -> tuple[int, int, list[int]] | None:
    """(reader, input position, forwarders on the way) when tensor t is read once (by a
    live read), looking through forwarders (without control edges, when `free`) that
    hand it on to one read; else None."""
    passed: list[int] = []
    for _ in range(MAX_FORWARDERS):
        reads = live_reads(index, t, dead)
        if len(reads) != 1:
            return None
        r, position = reads[0]
        if index.ops[r] not in FORWARDERS and not _plumbing(index, r, position) or \
                kept_by_grappler(index, r):  # a swap copy: the ops either side are apart
            return r, position, passed
        if free and not _free(index, r):
            return None
        passed.append(r)
        t = (r, position if index.ops[r] == "IdentityN" else 0)
    return None


def reads_through_forwarders(index: GraphIndex, t: Tensor,
                             extra: Callable[[GraphIndex, Tensor], int] | None = None) -> int:
    """How many reads of tensor t Grappler counts once its pruner has removed the
    forwarders (without control edges) between t and its readers: a forwarder's readers
    count as t's (Keras' swish hands `x * sigmoid(x)` on through an `IdentityN` that
    several ops read). `extra(index, tensor)`: reads to add for each tensor on the way."""
    count = 0
    todo, seen = [(t, 0)], set()
    while todo:
        u, depth = todo.pop()
        if u in seen:
            continue
        seen.add(u)
        if extra is not None:
            count += extra(index, u)
        for r, position in live_reads(index, u):
            if depth < MAX_FORWARDERS and index.ops[r] in FORWARDERS and _free(index, r) \
                    and not kept_by_grappler(index, r):
                todo.append(((r, position if index.ops[r] == "IdentityN" else 0), depth + 1))
            else:
                count += 1
    return count


def _plumbing(index: GraphIndex, r: int, position: int) -> bool:
    """Whether op r, reading its first input, is a broadcasting op's gradient plumbing that
    Grappler removes when both operands have one shape (broadcast_grads.py): the `Sum`
    over `BroadcastGradientArgs(Shape(x), Shape(y))` axes reduces nothing, and the
    `Reshape` to `Shape(x)` reshapes a value of that shape. What it reads then joins its
    reader's tree: Keras' hard swish's gradient `Mul(x, grad)`, summed, reshaped and
    divided by 6, is one product to Grappler (unknown sizes compare as written)."""
    if position != 0 or len(index.data_inputs[r]) != 2:
        return False
    value, other = index.data_inputs[r]
    if index.ops[r] == "Sum":
        if index.ops[other[0]] != "BroadcastGradientArgs" or \
                len(index.data_inputs[other[0]]) != 2:
            return False
        a, b = (_shape_read(index, s) for s in index.data_inputs[other[0]])
        return a is not None and a == b
    if index.ops[r] == "Reshape":
        target = _shape_read(index, other)
        if index.ops[value[0]] == "Sum" and _plumbing(index, value[0], 0):
            value = index.data_inputs[value[0]][0]  # its own shape is unknown statically
        return target is not None and target == index.shape(value)
    return False


def _shape_read(index: GraphIndex, t: Tensor) -> list[int] | None:
    """The static shape of what a `Shape` op reads (t its output), else None."""
    if index.ops[t[0]] != "Shape" or not index.data_inputs[t[0]]:
        return None
    return index.shape(index.data_inputs[t[0]][0])


def _free(index: GraphIndex, i: int) -> bool:
    return not index.control_inputs[i] and not index.control_consumers[i]


def regrouped_trees(index: GraphIndex) -> list[RegroupedTree]:
    """The trees of `index` that Grappler's arithmetic optimizer may rebuild in an order
    that rounds differently (see the module docstring)."""
    # member -> (its reader, position it is read at, forwarders between)
    folded: dict[int, tuple[int, int, list[int]]] = {}
    dead = dead_ops(index)
    for i in range(len(index)):
        f = family(index, i)
        if f is None or not _free(index, i):
            continue
        found = reader_through_forwarders(index, (i, 0), dead=dead)
        if found is None:
            continue
        reader, _, _ = found
        if family(index, reader) != f or index.devices[reader] != index.devices[i]:
            continue
        if f == ADD and not _free(index, reader):
            continue  # AddOpsRewrite leaves a tree alone whose root has control edges
        folded[i] = found
    children: dict[int, list[int]] = {}
    for m, (reader, _, _) in folded.items():
        children.setdefault(reader, []).append(m)
    trees = []
    for root in children:
        if root in folded:
            continue  # an inner op: its tree is collected from the outermost root
        members: list[int] = []
        forwarders: list[int] = []
        todo = [root]
        while todo:
            n = todo.pop()
            for m in children.get(n, ()):
                members.append(m)
                forwarders.extend(folded[m][2])
                todo.append(m)
        tree = RegroupedTree(family(index, root) or MUL, root, members, forwarders)
        if _reorders(index, tree, folded):
            trees.append(tree)
    return trees


def _reorders(index: GraphIndex, tree: RegroupedTree,
              folded: dict[int, tuple[int, int, list[int]]]) -> bool:
    """Whether rebuilding the tree can change its rounding: its operands have more than
    one shape (or one of unknown rank), or it is a sum that is not added left to right."""
    inside = set(tree.members) | set(tree.forwarders) | {tree.root}
    shapes = set()
    for n in [tree.root, *tree.members]:
        for s in index.data_inputs[n]:
            if s[0] in inside:
                continue
            shape = index.shape(s)
            if shape is None:
                return True  # unknown rank: assume it differs
            shapes.add(tuple(shape))  # unknown sizes compare as written (a batch of -1)
    if len(shapes) > 1:
        return True
    return tree.family == ADD and any(folded[m][1] != 0 for m in tree.members)

