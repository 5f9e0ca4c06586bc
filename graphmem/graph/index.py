"""One linear-time index over a GraphDef: the structure every analysis and pass reads.

Nodes are numbered in file order; tensors are (node id, output index) pairs. Data edges,
control edges, consumers, a topological order, control-flow frames and per-node facts
(device, statefulness, output dtypes and static shapes) are computed once, here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from functools import partial
from itertools import compress

from google.protobuf.message import Message

from graphmem import protos
from graphmem.background import Background
from graphmem.errors import InputError
from graphmem.graph import dtypes
from graphmem.graph.leading_dims import resolve_leading_dims
from graphmem.graph.names import parse_input
from graphmem.graph.opdefs import OpRegistry
from graphmem.native import native

Tensor = tuple[int, int]

CONTROL_FLOW_V1 = frozenset({"Enter", "RefEnter", "Exit", "RefExit", "Merge", "RefMerge",
                             "Switch", "RefSwitch", "NextIteration", "RefNextIteration",
                             "LoopCond"})
V2_LOOP_OPS = frozenset({"While", "StatelessWhile"})
CONTROL_FLOW_V2 = V2_LOOP_OPS | {"If", "StatelessIf", "Case", "StatelessCase"}
# ops that run a function of the library (besides ops named after one)
FUNCTION_CALLS = CONTROL_FLOW_V2 | {"PartitionedCall", "StatefulPartitionedCall"}
VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "TemporaryVariable",
                          "_VarHandlesOp"})
SUM_OPS = frozenset({"Add", "AddV2", "AddN"})  # how gradients are summed
_MERGES = frozenset({"Merge", "RefMerge"})
# Outputs a node may have when no OpDef says how many (an unknown op type): far above any
# real op's, low enough that per-output lists stay small.
MAX_UNKNOWN_OUTPUTS = 1 << 16
SHAPE_ONLY_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs",
                            "TensorShape"})


@dataclass
class GraphIndex:
    graph_def: Message
    registry: OpRegistry
    names: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    id_of: dict[str, int] = field(default_factory=dict)
    data_inputs: list[list[Tensor]] = field(default_factory=list)
    control_inputs: list[list[int]] = field(default_factory=list)
    consumers: dict[Tensor, list[int]] = field(default_factory=dict)
    control_consumers: list[list[int]] = field(default_factory=list)
    num_outputs: list[int] = field(default_factory=list)
    out_dtypes: list[list[int] | None] = field(default_factory=list)
    out_shapes: list[list[list[int] | None] | None] = field(default_factory=list)
    stateful: list[bool] = field(default_factory=list)
    topo: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)
    frame: list[str] = field(default_factory=list)
    _data_succ: list[list[int]] | None = None
    # parsed `_output_shapes` by their serialized form (lists shared, never mutated)
    _shape_cache: dict[bytes, list] = field(default_factory=dict)
    _bytes: dict[int | None, list] = field(default_factory=dict)
    _leading: dict[int, dict] = field(default_factory=dict)  # leading_dims, per batch size
    _dead: list[bool] | None = None  # may_be_dead, computed on first use
    # for opdef_check: nodes whose dtypes were guessed (no OpDef), and on a fresh compiled
    # read, each node's check signature (op and attrs, the contents of shapes and tensors
    # aside) and the first node of each
    guessed_dtypes: set[int] = field(default_factory=set)
    signature_groups: tuple[list[int], list[int]] | None = None

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def build(cls, graph_def: Message, registry: OpRegistry,
              previous: GraphIndex | None = None) -> GraphIndex:
        """One pass over the nodes. Written for speed on 100k+-node graphs: nodes and
        edges are read in C from the serialized graph when graphmem's extension is built
        (`_read_compiled`), else in Python (`_read_in_python`), and output dtypes come from
        a per-signature cache, since most nodes of a big graph repeat a few op signatures.

        `previous`: the index of this graph before a pass that only appended nodes and
        edited inputs (what every graphmem pass does). Per-node facts that depend on a
        node's op and attrs alone (dtypes, shapes, statefulness) are taken from it for the
        nodes it had; edges are always read afresh."""
        idx = cls(graph_def, registry)
        nodes = graph_def.node
        n = len(nodes)
        kept = 0
        if previous is not None and len(previous) <= n:
            kept = len(previous)
            if any(nodes[i].name != previous.names[i] for i in (0, kept // 2, kept - 1)
                   if kept):
                kept = 0  # not an appended-to graph after all: index from scratch
        if previous is not None:
            idx._shape_cache = previous._shape_cache
        max_out = attr_job = facts = None
        if native is not None:
            read = idx._read_compiled(previous if kept else None)
            if read is not None:
                max_out, facts = read
        if max_out is None:
            max_out, attr_job = idx._read_in_python(previous if kept else None)
        if kept:
            idx.stateful.extend(previous.stateful)
            idx.out_dtypes.extend(previous.out_dtypes)
            idx.out_shapes.extend(previous.out_shapes)
            idx.num_outputs.extend(max(a, b) for a, b in
                                   zip(previous.num_outputs, max_out[:kept], strict=True))
            if idx.num_outputs == previous.num_outputs:  # same outputs: sizes carry over
                idx._bytes = {batch: sizes + [None] * (n - kept)
                              for batch, sizes in previous._bytes.items()}
        if facts is None and attr_job is not None:
            facts = attr_job.result()
        if facts is None:  # not forked (or the child failed): read the attrs here
            facts = _attr_facts(nodes, idx.ops, kept, n, registry, idx._shape_cache)
        stateful, types_of, shapes_of, idx._shape_cache = facts
        idx.stateful.extend(stateful)
        out_dtypes, out_shapes, num_outputs = idx.out_dtypes, idx.out_shapes, idx.num_outputs
        for i, types, shapes in zip(range(kept, n), types_of, shapes_of, strict=True):
            n_shapes = len(shapes) if shapes else 0
            if max_out[i] > (MAX_UNKNOWN_OUTPUTS if types is None else len(types)):
                idx._past_outputs(i, None if types is None else len(types))
            if types is None:
                idx.guessed_dtypes.add(i)
                types = _guess_dtypes(nodes[i], max(max_out[i], n_shapes))
            out_dtypes.append(types)
            out_shapes.append(shapes if n_shapes else None)
            count = len(types) if types is not None else 0
            m = max_out[i]
            num_outputs.append(count if count >= m and count >= n_shapes else max(m, n_shapes))
        idx._toposort()
        idx._frames()
        if any(idx.frame):
            idx._condense_loops()
        return idx

    def _past_outputs(self, i: int, count: int | None) -> None:
        """Refuse a graph where a node reads an output node i does not have: past the
        outputs its OpDef gives it (`count`), or, without an OpDef, past any real op's
        (an index of 999999999 would make every per-output list that long)."""
        limit = MAX_UNKNOWN_OUTPUTS if count is None else count
        k = max(k for (s, k) in self.consumers if s == i)
        reader = self.consumers[(i, k)][0]
        text = next((t for t in self.graph_def.node[reader].input
                     if not t.startswith("^") and parse_input(t)[:2] == (self.names[i], k)),
                    f"{self.names[i]}:{k}")
        has = (f"has {count} output{'s' if count != 1 else ''}" if count is not None
               else f"cannot have more than {limit} outputs")
        raise InputError(f"node {self.names[reader]!r} reads {text[:200]!r}, but "
                         f"{self.names[i]!r} ({self.ops[i]}) {has}")

    def _read_compiled(self, previous: GraphIndex | None) -> tuple[list[int], tuple] | None:
        """Names, ops, devices (those of `previous` for the nodes it had) and edges from the
        serialized GraphDef, in C (native.py): the same lists `_read_in_python` makes, and
        `_attr_facts` of the nodes `previous` lacks. Returns each node's output count as
        its readers use them, and those facts; None when the bytes could not be read."""
        serialized = self.graph_def.SerializeToString()
        start = len(previous) if previous is not None else 0
        try:
            read = native.read_graph(serialized, start)
        except ValueError:
            return None
        if len(read) == 2:  # ("duplicate", name)
            raise InputError(f"the graph has two nodes named {read[1]!r}")
        if len(read) == 3:  # ("missing", node id, input)
            raise InputError(f"node {self.graph_def.node[read[1]].name!r} reads {read[2]!r}, "
                             "which is not in the graph")
        names, ops, devices, id_of, self.data_inputs, self.control_inputs, self.consumers, \
            self.control_consumers, max_out = read
        if previous is not None:
            names, ops, devices = (previous.names + names, previous.ops + ops,
                                   previous.devices + devices)
            id_of, new = previous.id_of.copy(), id_of
            id_of.update(new)
        self.names, self.ops, self.devices, self.id_of = names, ops, devices, id_of
        return max_out, self._compiled_attr_facts(serialized, start)

    def _compiled_attr_facts(self, serialized: bytes, start: int) -> tuple:
        """`_attr_facts` of nodes start.., from the nodes grouped in C by op signature (the
        op and its attrs but `_output_shapes`) and by `_output_shapes` value: each group is
        looked up, or parsed, once."""
        signature_of, firsts, shapes_of, values, check_of, check_firsts = native.read_attrs(
            serialized, start)
        if start == 0:
            self.signature_groups = (check_of, check_firsts)
        nodes = self.graph_def.node
        lookup = _SignatureCache(self.registry).lookup
        signatures = [lookup(self.ops[i], nodes[i]) for i in firsts]
        cache = self._shape_cache
        parsed = []
        for value in values:
            shapes = cache.get(value)
            if shapes is None:
                shapes = cache[value] = _shapes_of_attr(value)
            parsed.append(shapes)
        return ([signatures[s][0] for s in signature_of],
                [signatures[s][1] for s in signature_of],
                [parsed[k] if k >= 0 else None for k in shapes_of], cache)

    def _read_in_python(self, previous: GraphIndex | None
                        ) -> tuple[list[int], Background | None]:
        """Names, ops, devices (those of `previous` for the nodes it had) and edges. Input
        strings are split inline (the common `name` form first); op and device strings are
        shared. Returns each node's output count as its readers use them, and the forked
        child reading the attrs, if any."""
        nodes = self.graph_def.node
        n = len(nodes)
        names, id_of, ops, devices = self.names, self.id_of, self.ops, self.devices
        shared: dict[str, str] = {}
        kept = len(previous) if previous is not None else 0
        if kept:
            names.extend(previous.names)
            ops.extend(previous.ops)
            devices.extend(previous.devices)
            id_of.update(previous.id_of)
        for i in range(kept, n):
            node = nodes[i]
            name = node.name
            if name in id_of:
                raise InputError(f"the graph has two nodes named {name!r}")
            id_of[name] = i
            names.append(name)
            op = node.op
            ops.append(shared.setdefault(op, op))
            device = node.device
            devices.append(shared.setdefault(device, device))
        # Reading the attrs (output dtypes, `_output_shapes`) is a third of a fresh index's
        # cost and needs no edge: on a second core a forked child reads them while this
        # process reads the edges and sorts (background.py). Only where the file describes
        # every op type: a lookup in TensorFlow's registry would import TensorFlow there.
        attr_job = None
        registry = self.registry
        if not kept and registry.describes(set(ops)):
            attr_job = Background(partial(_attr_facts, nodes, ops, 0, n, registry, {}), n)
        control_consumers: list[list[int]] = [[] for _ in range(n)]
        self.control_consumers = control_consumers
        max_out = [0] * n
        consumers = self.consumers
        data_inputs = self.data_inputs
        control_inputs = self.control_inputs
        for i, node in enumerate(nodes):
            data: list[Tensor] = []
            ctrl: list[int] = []
            for text in node.input:
                src = id_of.get(text)  # the common case: output 0, written bare
                if src is not None:
                    k = 0
                else:
                    src_name, k, is_ctrl = parse_input(text)
                    src = id_of.get(src_name)
                    if src is None:
                        if attr_job is not None:
                            attr_job.cancel()
                        raise InputError(f"node {node.name!r} reads {text!r}, which is not "
                                         "in the graph")
                    if is_ctrl:
                        ctrl.append(src)
                        control_consumers[src].append(i)
                        continue
                t = (src, k)
                data.append(t)
                found = consumers.get(t)
                if found is None:
                    consumers[t] = [i]
                else:
                    found.append(i)
                if k >= max_out[src]:
                    max_out[src] = k + 1
            data_inputs.append(data)
            control_inputs.append(ctrl)
        return max_out, attr_job

    def add_control_edges(self, edges: list[tuple[int, int]]) -> None:
        """Record control edges (src, dst) a pass wrote into the GraphDef, without a
        rebuild; the order is recomputed only when an edge runs against it."""
        for src, dst in edges:
            self.control_inputs[dst].append(src)
            self.control_consumers[src].append(dst)
        self._dead = None
        if any(self.position[src] > self.position[dst] for src, dst in edges):
            self._toposort()
            if any(self.frame):
                self._condense_loops()

    def remove_control_edges(self, edges: list[tuple[int, int]]) -> None:
        """Forget control edges (src, dst) a pass removed from the GraphDef. Removing edges
        keeps every topological order valid: the order stays."""
        for src, dst in edges:
            self.control_inputs[dst].remove(src)
            self.control_consumers[src].remove(dst)
        self._dead = None

    def ordering_preds(self, i: int) -> list[int]:
        """The ops node i waits for: data and control inputs, less a Merge's loop back edge
        (NextIteration), which a topological order ignores."""
        ops = self.ops
        if ops[i] in ("Merge", "RefMerge"):
            preds = [s for s, _ in self.data_inputs[i]
                     if ops[s] not in ("NextIteration", "RefNextIteration")]
        else:
            preds = [s for s, _ in self.data_inputs[i]]
        return preds + self.control_inputs[i]

    def ordering_data_inputs(self) -> list[list[Tensor]]:
        """`data_inputs` less each Merge's loop back edges (from NextIteration), which a
        topological order ignores: a copy of the list only when the graph has Merges."""
        ops, data_inputs = self.ops, self.data_inputs
        if "Merge" not in ops and "RefMerge" not in ops:
            return data_inputs
        data_inputs = list(data_inputs)
        for i in compress(range(len(ops)), map(_MERGES.__contains__, ops)):
            data_inputs[i] = [t for t in data_inputs[i]
                              if ops[t[0]] not in ("NextIteration", "RefNextIteration")]
        return data_inputs

    def _toposort(self) -> None:
        """Kahn's algorithm over data and control edges, ignoring loop back edges."""
        n = len(self.names)
        order, indeg = self._kahn()
        if len(order) != n:
            stuck = next(self.names[i] for i in range(n) if indeg[i] > 0)
            raise InputError(f"the graph has a cycle outside any loop (through {stuck!r})")
        self.topo = order
        position = [0] * n
        for pos, i in enumerate(order):
            position[i] = pos
        self.position = position

    def _kahn(self) -> tuple[list[int], list[int]]:
        """`kahn` over `ordering_preds` of every node, without building the predecessor
        lists: successor lists come straight from the edges (the same lists, so the same
        order). In C when graphmem's extension is built (native.py)."""
        data_inputs = self.ordering_data_inputs()
        if native is not None:
            return native.kahn(data_inputs, self.control_inputs)
        n = len(self.names)
        succ: list[list[int]] = [[] for _ in range(n)]
        indeg = [0] * n
        for i, (data, ctrl) in enumerate(zip(data_inputs, self.control_inputs, strict=True)):
            for s, _ in data:
                succ[s].append(i)
            for s in ctrl:
                succ[s].append(i)
            indeg[i] = len(data) + len(ctrl)
        ready = deque([i for i in range(n) if not indeg[i]])
        order: list[int] = []
        push, pop, add = ready.append, ready.popleft, order.append
        while ready:
            i = pop()
            add(i)
            for j in succ[i]:
                d = indeg[j] - 1
                indeg[j] = d
                if not d:
                    push(j)
        return order, indeg

    def _condense_loops(self) -> None:
        """Reorder so that every v1 loop (its outermost frame, Exits included) is one block.

        Kahn's order ignores NextIteration back edges, so a loop's Merge, Switch and Exit can
        land long before the body they wait for at run time. Ordering loops as blocks keeps
        positions monotone along every real dependency path outside a loop body, which the
        passes rely on to bound their walks.
        """
        n = len(self.names)
        unit = list(range(n))
        frame_unit: dict[str, int] = {}
        for i in range(n):
            f = self.frame[i]
            if self.ops[i] in ("Exit", "RefExit") and self.data_inputs[i]:
                f = self.frame[self.data_inputs[i][0][0]]
            if f:
                outer = f[: f.find("/", 1)] if f.find("/", 1) > 0 else f
                unit[i] = frame_unit.setdefault(outer, n + len(frame_unit))
        members: dict[int, list[int]] = {}
        for i in self.topo:
            members.setdefault(unit[i], []).append(i)
        succ: dict[int, set[int]] = {}
        indeg = dict.fromkeys(members, 0)
        for i in range(n):
            preds = [s for s, _ in self.data_inputs[i]] + self.control_inputs[i]
            for s in preds:
                a, b = unit[s], unit[i]
                if a != b and b not in succ.setdefault(a, set()):
                    succ[a].add(b)
                    indeg[b] += 1
        first = {u: self.position[m[0]] for u, m in members.items()}
        ready = sorted((u for u, d in indeg.items() if d == 0), key=first.__getitem__)
        queue = deque(ready)
        order: list[int] = []
        done = 0
        while queue:
            u = queue.popleft()
            done += 1
            order.extend(members[u])
            for v in sorted(succ.get(u, ()), key=first.__getitem__):
                indeg[v] -= 1
                if indeg[v] == 0:
                    queue.append(v)
        if done != len(members):
            raise InputError("the graph has a cycle that passes through a loop (a loop's "
                             "result feeds back into its own inputs)")
        self.topo = order
        for pos, i in enumerate(order):
            self.position[i] = pos

    def _frames(self) -> None:
        """Control-flow v1 frame of each node ('' outside loops), propagated in topo order."""
        nodes = self.graph_def.node
        frame = [""] * len(self.names)
        if "Enter" not in self.ops and "RefEnter" not in self.ops:
            self.frame = frame  # no v1 loop: every op is outside any frame
            return
        parent: dict[str, str] = {}
        for i in self.topo:
            op = self.ops[i]
            ins = self.data_inputs[i]
            src_frame = frame[ins[0][0]] if ins else (
                frame[self.control_inputs[i][0]] if self.control_inputs[i] else "")
            if op in ("Enter", "RefEnter"):
                child = src_frame + "/" + nodes[i].attr["frame_name"].s.decode("utf-8", "replace")
                parent[child] = src_frame
                frame[i] = child
            elif op in ("Exit", "RefExit"):
                frame[i] = parent.get(src_frame, "")
            else:
                frame[i] = src_frame
        self.frame = frame

    # ---- queries ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.names)

    def node(self, i: int) -> Message:
        return self.graph_def.node[i]

    def tensor_name(self, t: Tensor) -> str:
        return f"{self.names[t[0]]}:{t[1]}"

    def tensor(self, name: str) -> Tensor | None:
        node, k, ctrl = parse_input(name)
        i = self.id_of.get(node)
        if i is None or ctrl or k >= max(self.num_outputs[i], 1):
            return None
        return (i, k)

    def dtype(self, t: Tensor) -> int | None:
        types = self.out_dtypes[t[0]]
        return types[t[1]] if types is not None and t[1] < len(types) else None

    def shape(self, t: Tensor) -> list[int] | None:
        shapes = self.shapes_of(t[0])
        return shapes[t[1]] if shapes is not None and t[1] < len(shapes) else None

    def shapes_of(self, i: int) -> list[list[int] | None] | None:
        """Static shapes of node i's outputs (from `_output_shapes`, parsed by `build`)."""
        return self.out_shapes[i]

    def output_bytes(self, batch_size: int | None):
        """A function i -> bytes of each output of node i (None where unknown), cached per
        batch size: the schedule and the memory simulation ask for every node, twice per
        rewrite."""
        cache = self._bytes.get(batch_size)
        if cache is None:
            cache = self._bytes[batch_size] = [None] * len(self.names)
        shapes_of, out_dtypes, num_outputs = self.shapes_of, self.out_dtypes, self.num_outputs
        leading = self.leading_dims(batch_size)
        resolved = {t[0] for t in leading}
        # shape and dtype lists are shared between nodes of the same signature (see
        # _shape_cache, _SignatureCache): so are their sizes
        # (the entry holds the lists it was computed from, so their ids stay theirs)
        by_signature: dict[tuple[int, int, int], tuple] = {}

        def sizes_of(i: int) -> list[int | None]:
            found = cache[i]
            if found is None and i in resolved:
                found = cache[i] = [self.tensor_bytes((i, k), batch_size)
                                    for k in range(num_outputs[i])]
            elif found is None:
                shapes = shapes_of(i) or ()
                types = out_dtypes[i] or ()
                key = (id(shapes), id(types), num_outputs[i])
                entry = by_signature.get(key)
                if entry is None:
                    entry = by_signature[key] = (shapes, types, [
                        nbytes(shapes[k] if k < len(shapes) else None,
                               types[k] if k < len(types) else None, batch_size)
                        for k in range(num_outputs[i])])
                found = cache[i] = entry[2]
            return found

        return sizes_of

    def leading_dims(self, batch_size: int | None) -> dict[Tensor, int]:
        """Outputs whose unknown leading dimension is not the batch size (a reshape's
        `[-1, n]` over batch x positions), with its value at `batch_size`: see
        `leading_dims.resolve_leading_dims`. Computed once per batch size."""
        if not batch_size:
            return {}
        found = self._leading.get(batch_size)
        if found is None:
            found = self._leading[batch_size] = resolve_leading_dims(self, batch_size)
        return found

    def shape_at(self, t: Tensor, batch_size: int | None) -> list[int] | None:
        """Tensor t's static shape with its unknown leading dimension as `leading_dims`
        resolves it (left unknown, for the batch size, where it does not)."""
        shape = self.shape(t)
        rows = self.leading_dims(batch_size).get(t) if shape and shape[0] < 0 else None
        return shape if rows is None else [rows, *shape[1:]]

    def static_shape(self, t: Tensor, batch_size: int | None) -> list[int] | None:
        """Tensor t's static shape at `batch_size` (its unknown leading dimension resolved
        as `leading_dims` says, else the batch size); None when a dimension stays unknown."""
        return static_shape(self.shape_at(t, batch_size), batch_size)

    def num_elements(self, t: Tensor, batch_size: int | None) -> int | None:
        """Elements of tensor t at `batch_size` (`static_shape`); None when unknown."""
        return num_elements(self.shape_at(t, batch_size), batch_size)

    def tensor_bytes(self, t: Tensor, batch_size: int | None) -> int | None:
        """Bytes of tensor t at `batch_size`; None when its size or dtype is unknown."""
        return nbytes(self.shape_at(t, batch_size), self.dtype(t), batch_size)

    def output_sizes(self, batch_size: int | None) -> list[list[int | None]]:
        """`output_bytes` of every node at once, as the list its cache holds: for loops
        that ask for every node (the step's schedule, the simulation), where a list index
        is several times cheaper than a call. Stale after `set_shapes`: ask again."""
        sizes_of = self.output_bytes(batch_size)
        cache = self._bytes[batch_size]
        for i in range(len(cache)):
            if cache[i] is None:
                sizes_of(i)
        return cache

    def outputs(self, i: int) -> list[Tensor]:
        return [(i, k) for k in range(self.num_outputs[i])]

    def data_consumers(self, i: int) -> list[int]:
        """Readers of any output of node i (a reader of two outputs appears twice): those
        of output 0 first, then of output 1, ..., each in the order of `consumers`."""
        return self._successors()[i]

    def _successors(self) -> list[list[int]]:
        """Data readers of every node, built on first use: walks ask for every node."""
        if self._data_succ is None:
            succ: list[list[int]] = [[] for _ in range(len(self.names))]
            several: set[int] = set()
            for (src, k), readers in self.consumers.items():
                succ[src].extend(readers)
                if k:
                    several.add(src)
            for src in several:  # in output order, as callers have always seen them
                succ[src] = [c for k in range(self.num_outputs[src])
                             for c in self.consumers.get((src, k), ())]
            self._data_succ = succ
        return self._data_succ

    def ancestors(self, seeds, data_only: bool = False, stop=()) -> set[int]:
        """The seeds and every op they depend on (through data, and control unless
        data_only). Ops in `stop` are reached (and returned) but not walked past: for a
        caller that knows what lies beyond them."""
        seen = set(seeds)
        stack = [i for i in seen if i not in stop] if stop else list(seen)
        data_inputs, control_inputs = self.data_inputs, self.control_inputs
        add, push, pop = seen.add, stack.append, stack.pop
        while stack:
            i = pop()
            for j, _ in data_inputs[i]:
                if j not in seen:
                    add(j)
                    if j not in stop:
                        push(j)
            if not data_only:
                for j in control_inputs[i]:
                    if j not in seen:
                        add(j)
                        if j not in stop:
                            push(j)
        return seen

    def descendants(self, seeds, data_only: bool = False, stop=()) -> set[int]:
        """The seeds and every op that depends on them (`stop`: as for `ancestors`)."""
        seen = set(seeds)
        stack = [i for i in seen if i not in stop] if stop else list(seen)
        data_succ, control_consumers = self._successors(), self.control_consumers
        add, push, pop = seen.add, stack.append, stack.pop
        while stack:
            i = pop()
            for j in data_succ[i]:
                if j not in seen:
                    add(j)
                    if j not in stop:
                        push(j)
            if not data_only:
                for j in control_consumers[i]:
                    if j not in seen:
                        add(j)
                        if j not in stop:
                            push(j)
        return seen

    def is_control_flow(self, i: int) -> bool:
        return self.ops[i] in CONTROL_FLOW_V1 or self.ops[i] in CONTROL_FLOW_V2

    def in_loop(self, i: int) -> bool:
        return bool(self.frame[i])

    def through_identity(self, i: int, limit: int = 8) -> int:
        """The op behind a chain of Identity ops ending at op i (TF's gradient tuples and
        loop bodies wrap values in them)."""
        return self.under_identities((i, 0), limit=limit)[0]

    def under_identities(self, t: Tensor, also: AbstractSet[int] = frozenset(),
                         limit: int = 8) -> Tensor:
        """The tensor under a chain of Identity ops (and of the ops in `also`, which hand
        on their first input) that ends at tensor t."""
        for _ in range(limit):
            s = t[0]
            if not self.data_inputs[s] or (self.ops[s] != "Identity" and s not in also):
                break
            t = self.data_inputs[s][0]
        return t

    def may_be_dead(self, i: int) -> bool:
        """Whether op i can produce a dead tensor: it runs in a control-flow v1 branch (a
        `tf.cond` branch, or a loop body), downstream of a Switch and before the Merge that
        joins the branches. TF's executor passes deadness along data *and control* edges,
        so a control edge from such an op makes its target dead whenever the branch is not
        taken: a pass must never add one to an op that has to run."""
        if self._dead is None:
            if "Switch" not in self.ops and "RefSwitch" not in self.ops:
                self._dead = [False] * len(self.names)  # no branches: every context is ()
            else:
                self._dead = [bool(c) for c in self._branch_contexts()]
        return self._dead[i]

    def _branch_contexts(self) -> list[tuple]:
        """Per op, the v1 branches it runs in, outermost first: ((predicate tensor, branch),
        ...), empty when it always runs. One pass in topological order: a reader of
        Switch output k enters branch k of the Switch's predicate (the Switch itself is in
        both, marked None); a Merge runs in what its inputs share (the two branches of one
        predicate join); an Exit leaves its loop's branch; any other op runs in the deepest
        context among its inputs. Contexts are shared tuples: no per-op copies."""
        n = len(self.names)
        ctx: list[tuple] = [()] * n
        ops = self.ops
        for j in self.topo:
            op = ops[j]
            ins = self.data_inputs[j]
            if op in ("Merge", "RefMerge"):
                srcs = [self._read_context(ctx, s, k) for s, k in ins
                        if ops[s] not in ("NextIteration", "RefNextIteration")]
                c = srcs[0] if srcs else ()
                for other in srcs[1:]:
                    m = 0
                    while m < min(len(c), len(other)) and c[m] == other[m]:
                        m += 1
                    c = c[:m]
            else:
                c = ()
                for s, k in ins:
                    r = self._read_context(ctx, s, k)
                    if len(r) > len(c):
                        c = r
                for s in self.control_inputs[j]:
                    r = ctx[s]
                    if len(r) > len(c):
                        c = r
                if op in ("Switch", "RefSwitch") and len(ins) == 2:
                    c = (*c, (ins[1], None))
                elif op in ("Exit", "RefExit") and c:
                    c = c[:-1]
            ctx[j] = c
        return ctx

    def _read_context(self, ctx: list[tuple], s: int, k: int) -> tuple:
        """The context of reading output k of op s: a Switch's output k is its branch k."""
        c = ctx[s]
        if c and self.ops[s] in ("Switch", "RefSwitch") and c[-1][1] is None:
            return (*c[:-1], (c[-1][0], k))
        return c

    def set_shapes(self, shapes: dict[str, list[list[int] | None]],
                   types: dict[str, list[int]], override: bool = False) -> None:
        """Fill shapes (and dtypes) found by TensorFlow's shape inference; with `override`,
        also replace shapes the graph carried when the new ones know more."""
        self._bytes.clear()
        self._leading.clear()
        for name, value in shapes.items():
            i = self.id_of.get(name)
            if i is None:
                continue
            old = self.shapes_of(i)
            if old is None or (override and _known_dims(value) > _known_dims(old)):
                self.out_shapes[i] = value
            if self.out_dtypes[i] is None and name in types:
                self.out_dtypes[i] = types[name]
                self.num_outputs[i] = max(self.num_outputs[i], len(types[name]))

    def has_inner_unknown_dims(self, nodes) -> bool:
        """Whether some data output of `nodes` has a size unknown even with a batch size.
        Asked once per pair of shape and dtype lists: nodes of one signature share them."""
        verdicts: dict[tuple[int, int], bool] = {}
        out_dtypes, shapes_of = self.out_dtypes, self.shapes_of
        for i in nodes:
            shapes = shapes_of(i)
            if not shapes:
                continue
            types = out_dtypes[i] or ()
            key = (id(shapes), id(types))  # both lists outlive the loop: ids stay theirs
            unknown = verdicts.get(key)
            if unknown is None:
                unknown = verdicts[key] = _inner_unknown(shapes, types)
            if unknown:
                return True
        return False

    def has_shapes(self) -> bool:
        return any(s is not None for s in self.out_shapes)

    def frames(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for f in self.frame:
            if f:
                counts[f] = counts.get(f, 0) + 1
        return counts


def kahn(preds: list[list[int]]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm over predecessor lists (node ids 0..len-1): the order it reaches
    (first in, first out), and each node's count of predecessors never reached, which is
    non-zero exactly for the nodes on or after a cycle."""
    n = len(preds)
    indeg = [len(p) for p in preds]
    succ: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(preds):
        for s in p:
            succ[s].append(i)
    ready = deque(i for i in range(n) if indeg[i] == 0)
    order: list[int] = []
    while ready:
        i = ready.popleft()
        order.append(i)
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    return order, indeg


def closing_cycles(index: GraphIndex, edges: dict[int, list[tuple[int, int]]]) -> list[int]:
    """Keys of the edge groups (`edges[key]`: (source, destination) pairs a pass wants to
    add) that would close a cycle, alone or together with the other groups
    (a1 -> x1 -> ... -> a2 -> x2 -> ... -> a1). Edges that run along the topological order
    cannot; otherwise one Kahn pass over the graph with every edge finds the ops left
    waiting, and the groups with an edge into them are dropped: every cycle runs through
    such an edge, and the graph without them is acyclic."""
    position = index.position
    if all(position[u] < position[v] for es in edges.values() for u, v in es):
        return []
    preds = [index.ordering_preds(i) for i in range(len(index))]
    for es in edges.values():
        for u, v in es:
            preds[v].append(u)
    _, indeg = kahn(preds)
    return [a for a, es in edges.items() if any(indeg[v] > 0 for _, v in es)]


def _attr_facts(nodes, ops: list[str], start: int, end: int, registry: OpRegistry,
                shape_cache: dict[bytes, list]) -> tuple[list[bool], list, list, dict]:
    """Statefulness, output dtypes (None without an OpDef) and parsed `_output_shapes` of
    nodes start..end-1, from their op and attrs alone, and `shape_cache` with the shapes
    added. Each distinct `_output_shapes` value is parsed once, keyed by its serialized
    form: big graphs repeat a few shapes, and one C call to serialize beats walking the
    dims in Python; nodes of one value share one list (so do nodes of one signature their
    dtype list), which later caches key on."""
    lookup = _SignatureCache(registry).lookup
    stateful_of: list[bool] = []
    types_of: list = []
    shapes_of: list = []
    for i in range(start, end):
        node = nodes[i]
        attrs = node.attr  # one wrapper per node, handed to the lookup too
        stateful, types = lookup(ops[i], node, attrs)
        stateful_of.append(stateful)
        types_of.append(types)
        if "_output_shapes" in attrs:
            value = attrs["_output_shapes"]
            key = value.SerializeToString()
            shapes = shape_cache.get(key)
            if shapes is None:
                shapes = shape_cache[key] = _shapes_in(value)
            shapes_of.append(shapes)
        else:
            shapes_of.append(None)
    return stateful_of, types_of, shapes_of, shape_cache


class _SignatureCache:
    """Statefulness and output dtypes per op signature: the op type and the values of the
    attrs its output args read. Lists handed out are shared between nodes; nobody mutates
    them."""

    def __init__(self, registry: OpRegistry) -> None:
        self.registry = registry
        self.attr_names: dict[str, tuple[str, ...] | None] = {}
        self.stateful: dict[str, bool] = {}
        self.types: dict[tuple, list[int] | None] = {}

    def lookup(self, op: str, node: Message, attrs=None) -> tuple[bool, list[int] | None]:
        """`attrs`: node.attr, when the caller has it already."""
        keys = self.attr_names.get(op, False)
        if keys is False:
            keys = self.attr_names[op] = self.registry.output_attr_names(op)
            self.stateful[op] = self.registry.is_stateful(op)
        stateful = self.stateful[op]
        if keys is None:  # no OpDef: nothing to share
            return stateful, self.registry.output_dtypes(node)
        if attrs is None:
            attrs = node.attr
        if len(keys) == 1:  # most ops: one type attr (T, dtype)
            a = keys[0]
            key = (op, _attr_key(attrs[a]) if a in attrs else None)
        else:
            key = (op, *[_attr_key(attrs[a]) if a in attrs else None for a in keys])
        found = self.types.get(key, False)
        if found is False:
            found = self.types[key] = self.registry.output_dtypes(node)
        return stateful, found


def _attr_key(value: Message) -> object:
    """The part of an AttrValue an output signature can read: a type, a count or a list
    of types."""
    kind = value.WhichOneof("value")
    if kind == "type":
        return value.type
    if kind == "i":
        return value.i
    if kind == "list":
        return tuple(value.list.type)
    return kind


def _inner_unknown(shapes: list[list[int] | None], types) -> bool:
    """Whether an output other than a resource or variant has a dim unknown past the
    batch dim (or an unknown rank)."""
    for k, shape in enumerate(shapes):
        if k < len(types) and dtypes.base(types[k]) in (dtypes.RESOURCE, dtypes.VARIANT):
            continue
        if shape is None or any(d < 0 for d in shape[1:]):
            return True
    return False


def _known_dims(shapes: list[list[int] | None] | None) -> int:
    return sum(1 for s in shapes or () if s is not None for d in s if d >= 0)


def _shapes_in(attr: Message) -> list[list[int] | None]:
    """The shapes an `_output_shapes` AttrValue lists (None: unknown rank)."""
    return [None if shape.unknown_rank else [d.size for d in shape.dim]
            for shape in attr.list.shape]


def _shapes_of_attr(value: bytes) -> list[list[int] | None]:
    attr = protos.AttrValue()
    attr.ParseFromString(value)
    return _shapes_in(attr)


def _guess_dtypes(node: Message, count: int) -> list[int] | None:
    for key in ("T", "dtype", "out_type", "DstT"):
        if key in node.attr and node.attr[key].type:
            return [node.attr[key].type] * max(count, 1)
    return None


def nbytes(shape: list[int] | None, dtype: int | None, batch_size: int | None = None) -> int | None:
    """Bytes of a tensor of static `shape`; an unknown leading dim takes `batch_size`."""
    if dtype is None:
        return None
    size = dtypes.itemsize(dtype)
    n = num_elements(shape, batch_size) if size is not None else None
    return None if n is None else size * n


def num_elements(shape: list[int] | None, batch_size: int | None = None) -> int | None:
    """Elements of a tensor of static `shape`; an unknown leading dim takes `batch_size`."""
    dims = static_shape(shape, batch_size)
    if dims is None:
        return None
    n = 1
    for d in dims:
        n *= d
    return n


def static_shape(shape: list[int] | None, batch_size: int | None = None) -> list[int] | None:
    """`shape` with an unknown leading dim set to `batch_size`; None when any other dim
    (or, without a batch size, the leading one) is unknown."""
    if shape is None:
        return None
    out = []
    for axis, d in enumerate(shape):
        if d < 0:
            if batch_size is None or axis != 0:
                return None
            d = batch_size
        out.append(d)
    return out


def attr_of(node: Message, key: str) -> Message:
    """`node.attr[key]`, or an empty AttrValue (its fields read as the type's zero) when
    the node has none, without adding one: indexing a protobuf map adds the key, and an
    attr left empty so is one TF refuses to import (graphs saved with default attrs
    stripped, as Keras saves them, lack every attr at its default)."""
    return node.attr[key] if key in node.attr else protos.AttrValue()
