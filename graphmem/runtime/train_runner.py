"""Run a TF1-style training graph step by step: the engine behind `graphmem verify`.

Both graphs start from the same variable values (the original's initializers run once and
their values are copied into the rewritten graph), get the same feeds each step, and are
stepped alternately in one process, so their memory is measured under the same conditions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphmem.analysis.activations import INPUT_OPS
from graphmem.analysis.regions import Regions, analyze_regions
from graphmem.errors import InputError, UsageError
from graphmem.formats import LoadedModel
from graphmem.graph.index import VARIABLE_OPS, GraphIndex
from graphmem.graph.workspace import Workspace
from graphmem.runtime.tf_loader import tensorflow

_INT_RANGE_READERS = {"SparseSoftmaxCrossEntropyWithLogits": ("logits", -1),
                      "OneHot": ("depth", None), "GatherV2": ("params", 0),
                      "ResourceGather": ("resource", 0), "Gather": ("params", 0)}


@dataclass
class RunSpec:
    train_op: str | None = None
    loss: str | None = None
    init_op: str | None = None
    batch_size: int = 8
    feeds: dict[str, np.ndarray] = field(default_factory=dict)
    seed: int = 0
    inter_op_threads: int = 1
    # Grappler's own memory optimizer for this session (e.g. "RECOMPUTATION_HEURISTICS"),
    # to measure it side by side; None keeps TensorFlow's default.
    grappler_memory_optimization: str | None = None
    # Grappler fuses and rewrites ops (MatMul+BiasAdd, Mul+Square, ...) only where an
    # intermediate has one reader, so a rewrite that changes readers can change which ops
    # Grappler rewrites, moving results by float rounding (about 1e-7). With Grappler off,
    # a correct rewrite trains bit for bit the same.
    grappler: bool = True
    backward_scopes: list[str] | None = None  # name scopes of the backward pass (None: default)


@dataclass
class StepRecord:
    loss: float
    peak_bytes: int  # step's allocator peak above what was resident before it
    seconds: float


class GraphRunner:
    """One imported graph in its own tf.Session."""

    def __init__(self, ws: Workspace, spec: RunSpec, regions: Regions | None = None):
        tf = tensorflow("verify runs the graphs")
        self.tf = tf
        model = ws.model
        self.index = ws.index
        self.regions = regions or analyze_regions(ws.index, spec.backward_scopes, spec.batch_size,
                                                  ws.collection("losses"))
        self.graph = tf.Graph()
        with self.graph.as_default():
            self._import(model)
            self.train_op = self._find_train_op(ws, spec)
            self.loss = self._find_loss(spec)
            self.init = self._find_init(spec)
            self._build_variable_io()
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                          inter_op_parallelism_threads=spec.inter_op_threads,
                                          # else the first session's pool size wins for all
                                          use_per_session_threads=True,
                                          device_count={"CPU": self.cpu_devices})
        from tensorflow.core.protobuf import rewriter_config_pb2

        if spec.grappler_memory_optimization:
            config.graph_options.rewrite_options.memory_optimization = getattr(
                rewriter_config_pb2.RewriterConfig, spec.grappler_memory_optimization)
        if not spec.grappler:
            config.graph_options.rewrite_options.disable_meta_optimizer = True
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)

    def _import(self, model: LoadedModel) -> None:
        from graphmem.runtime.tf_loader import rejects_as_input_error

        with rejects_as_input_error(f"TensorFlow cannot import {model.path}"):
            self._import_into_graph(model)

    def _import_into_graph(self, model: LoadedModel) -> None:
        """Device strings are kept when every op is placed on a CPU (multi-tower graphs
        built on logical CPU devices: the session gets as many), else cleared, so that a
        graph built for accelerators runs here."""
        tf = self.tf
        self.cpu_devices = cpu_device_count(self.index.devices)
        keep = self.cpu_devices > 1
        if model.meta_graph is not None:
            meta = tf.compat.v1.MetaGraphDef.FromString(model.meta_graph.SerializeToString())
            tf.compat.v1.train.import_meta_graph(meta, clear_devices=not keep)
        else:
            gd = tf.compat.v1.GraphDef.FromString(model.graph_def.SerializeToString())
            if not keep:
                for node in gd.node:
                    node.device = ""
            tf.compat.v1.import_graph_def(gd, name="")

    def _find_train_op(self, ws: Workspace, spec: RunSpec):
        name = spec.train_op or next(iter(ws.collection("train_op")), None)
        if name is None:
            sinks = [i for i in self.regions.optimizer
                     if not self.index.data_consumers(i) and not self.index.control_consumers[i]]
            if len(sinks) != 1:
                raise InputError("cannot tell the train op (no `train_op` collection); pass "
                                 "--train-op")
            name = self.index.names[sinks[0]]
        return self._lookup(name, "train op")

    def _find_loss(self, spec: RunSpec):
        name = spec.loss or (self.index.tensor_name(self.regions.loss[-1])
                             if self.regions.loss else None)
        if name is None:
            raise InputError("cannot find the loss; pass --loss")
        return self._lookup(name if ":" in name else name + ":0", "loss")

    def _find_init(self, spec: RunSpec):
        if spec.init_op:
            return self._lookup(spec.init_op, "init op")
        return self.tf.compat.v1.global_variables_initializer() \
            if self.tf.compat.v1.global_variables() else self._lookup("init", "init op")

    def _lookup(self, name: str, what: str):
        try:
            return self.graph.as_graph_element(name)
        except (KeyError, ValueError):
            raise InputError(f"no {what} {name!r} in the graph") from None

    def _build_variable_io(self) -> None:
        """Read and assign ops for every variable, by the variable op's name."""
        tf = self.tf
        self.var_read, self.var_assign = {}, {}
        for op in self.graph.get_operations():
            if op.type not in VARIABLE_OPS:
                continue
            if op.type == "VarHandleOp":
                dtype = op.get_attr("dtype")
                read = tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=dtype)
                ph = tf.compat.v1.placeholder(dtype, name=f"graphmem_feed/{op.name}")
                assign = tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=ph)
            else:
                read = tf.identity(op.outputs[0])
                ph = tf.compat.v1.placeholder(op.outputs[0].dtype.base_dtype,
                                              name=f"graphmem_feed/{op.name}")
                assign = tf.compat.v1.assign(op.outputs[0], ph)
            self.var_read[op.name] = read
            self.var_assign[op.name] = (assign, ph)

    def initialize(self) -> None:
        self.session.run(self.init)

    def variables(self) -> dict[str, np.ndarray]:
        names = sorted(self.var_read)
        values = self.session.run([self.var_read[n] for n in names])
        return dict(zip(names, values, strict=True))

    def load_variables(self, values: dict[str, np.ndarray]) -> None:
        missing = sorted(set(values) - set(self.var_assign))
        if missing:
            raise InputError(f"the rewritten graph lacks variables: {', '.join(missing[:5])}")
        ops, feed = [], {}
        for name, value in values.items():
            assign, ph = self.var_assign[name]
            ops.append(assign)
            feed[ph] = value
        self.session.run(ops, feed)

    def step(self, feeds: dict[str, np.ndarray]) -> StepRecord:
        tf = self.tf
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        start = time.perf_counter()
        loss, _ = self.session.run([self.loss, self.train_op], feeds)
        seconds = time.perf_counter() - start
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        return StepRecord(float(np.mean(loss)), max(peak - before, 0), seconds)

    def close(self) -> None:
        self.session.close()


class FunctionRunner:
    """A TF2 SavedModel whose train step is a library function, loaded with
    `tf.saved_model.load` and called eagerly, as its users run it."""

    def __init__(self, ws: Workspace, spec: RunSpec):
        tf = tensorflow("verify runs the train step")
        self.tf = tf
        self.index = ws.index
        self.spec = spec
        self.regions = analyze_regions(ws.index, spec.backward_scopes, spec.batch_size)
        # functions are optimized when first called, under this process-wide setting: set it
        # either way, so one run's choice does not leak into the next
        tf.config.optimizer.set_experimental_options(
            {"disable_meta_optimizer": not spec.grappler})
        try:  # the same thread settings as the TF1 sessions; only possible before TF starts
            tf.config.threading.set_intra_op_parallelism_threads(1)
            tf.config.threading.set_inter_op_parallelism_threads(spec.inter_op_threads)
        except RuntimeError:
            pass
        self.obj = tf.saved_model.load(str(ws.model.path), tags=list(ws.model.tags) or None)
        self.fn, self.signature = self._find_train_step(ws)
        self.vars = _saved_variables(tf, self.obj)

    def _find_train_step(self, ws: Workspace):
        """The attribute the object graph binds the train-step function to (TF renames
        functions when it loads them, so the binding is the reliable link)."""
        path = _object_path_of_function(ws.model.meta_graph, ws.model.function_name)
        if path is None:
            raise InputError(f"no object of the SavedModel calls {ws.model.function_name}")
        fn = self.obj
        for part in path:
            fn = getattr(fn, part)
        concrete = fn.concrete_functions[0]
        return fn, concrete.structured_input_signature[0]

    def initialize(self) -> None:
        """Variables come restored from the SavedModel's checkpoint."""

    def variables(self) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.vars.items()}

    def load_variables(self, values: dict[str, np.ndarray]) -> None:
        missing = sorted(set(values) - set(self.vars))
        if missing:
            raise InputError(f"the rewritten model lacks variables: {', '.join(missing[:5])}")
        for name, value in values.items():
            self.vars[name].assign(value)

    def feeds(self, step: int) -> list[np.ndarray]:
        rng = np.random.default_rng(self.spec.seed * 1_000_003 + step)
        out = []
        for spec in self.signature:
            shape = [self.spec.batch_size if d is None else d for d in spec.shape.as_list()]
            arg = self.index.id_of.get(spec.name)
            if arg is None:
                raise InputError(f"train step argument {spec.name!r} not found")
            out.append(_random_value(self.index, arg, spec.dtype.as_datatype_enum, shape, rng))
        return out

    def step(self, feeds: list[np.ndarray]) -> StepRecord:
        tf = self.tf
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        start = time.perf_counter()
        loss = self.fn(*feeds)
        loss_value = float(np.mean(tf.nest.flatten(loss)[0].numpy()))
        seconds = time.perf_counter() - start
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
        return StepRecord(loss_value, max(peak - before, 0), seconds)

    def close(self) -> None:
        self.obj = None


def _object_path_of_function(meta_graph, function_name: str) -> list[str] | None:
    nodes = meta_graph.object_graph_def.nodes
    if not nodes:
        return None
    stack: list[tuple[int, list[str]]] = [(0, [])]
    seen = {0}
    while stack:
        node_id, path = stack.pop()
        node = nodes[node_id]
        which = node.WhichOneof("kind")
        if which == "function" and function_name in node.function.concrete_functions:
            return path
        for child in node.children:
            if child.node_id not in seen:
                seen.add(child.node_id)
                stack.append((child.node_id, path + [child.local_name]))
    return None


def _saved_variables(tf, root) -> dict[str, object]:
    """Every variable reachable from the loaded object, by its path of attribute names."""
    out: dict[str, object] = {}
    seen: set[int] = set()
    stack = [("", root)]
    while stack:
        path, obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tf.Variable):
            out[path or "/"] = obj
            continue
        try:
            children = obj._trackable_children()  # noqa: SLF001 - the loader's own walk
        except (AttributeError, TypeError, ValueError):
            continue
        stack.extend((f"{path}/{k}", v) for k, v in children.items())
    return out


def cpu_device_count(devices: list[str]) -> int:
    """How many logical CPU devices the graph's device strings name (the highest number
    plus one); 1 when any op is placed on another kind of device or none names one."""
    from graphmem.graph.devices import normalize_device

    highest = 0
    for device in set(devices):
        if not device:
            continue
        kind, _, number = normalize_device(device)[len("/device:"):].partition(":")
        if kind != "CPU" or not number.isdigit():
            return 1
        highest = max(highest, int(number))
    return highest + 1


def make_runner(ws: Workspace, spec: RunSpec):
    if ws.model.function_name is not None:
        return FunctionRunner(ws, spec)
    return GraphRunner(ws, spec)


def placeholders(index: GraphIndex, regions: Regions) -> list[int]:
    step = regions.step_nodes(index)
    return [i for i in index.topo if i in step and index.ops[i] in INPUT_OPS
            and index.ops[i] != "PlaceholderWithDefault"]


def make_feeds(index: GraphIndex, regions: Regions, spec: RunSpec, step: int) -> dict:
    """Random inputs from placeholder shapes, the same for both graphs at the same step."""
    rng = np.random.default_rng(spec.seed * 1_000_003 + step)
    feeds = {}
    for i in placeholders(index, regions):
        name = index.names[i] + ":0"
        if name in spec.feeds or index.names[i] in spec.feeds:
            feeds[name] = spec.feeds.get(name, spec.feeds.get(index.names[i]))
            continue
        node = index.node(i)
        dims = [d.size for d in node.attr["shape"].shape.dim] if "shape" in node.attr else None
        if dims is None or node.attr["shape"].shape.unknown_rank:
            dims = index.shape((i, 0))
        if dims is None:
            raise InputError(f"placeholder {index.names[i]} has an unknown shape; pass --feed")
        if any(d < 0 for d in dims[1:]):
            raise InputError(f"placeholder {index.names[i]} has unknown inner dimensions "
                             f"{dims}; pass --feed {index.names[i]}=FILE.npy")
        shape = [spec.batch_size if d < 0 else d for d in dims]
        feeds[name] = _random_value(index, i, node.attr["dtype"].type, shape, rng)
    return feeds


def _random_value(index: GraphIndex, i: int, dtype: int, shape: list[int], rng):
    from graphmem.graph import dtypes

    np_type = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 10: np.bool_,
               19: np.float16, 4: np.uint8}.get(dtype)
    if np_type is None:
        raise InputError(f"cannot make random data of type {dtypes.name(dtype)} for "
                         f"{index.names[i]}; pass --feed")
    if np_type in (np.float32, np.float64, np.float16):
        return rng.standard_normal(shape).astype(np_type)
    if np_type is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    high = _integer_range(index, i)
    return rng.integers(0, high, shape).astype(np_type)


def _integer_range(index: GraphIndex, i: int) -> int:
    """Integer inputs are usually labels or ids: keep them below what their readers accept."""
    frontier, seen, bound = [i], {i}, None
    for _ in range(4):
        nxt = []
        for j in frontier:
            for c in index.data_consumers(j):
                op = index.ops[c]
                if op in ("SparseSoftmaxCrossEntropyWithLogits",):
                    shape = index.shape(index.data_inputs[c][0])
                    b = shape[-1] if shape and shape[-1] > 0 else None
                elif op in ("GatherV2", "Gather", "ResourceGather"):
                    src = index.data_inputs[c][0]
                    shape = index.shape(src)
                    if op == "ResourceGather" or shape is None:
                        shape = _resource_shape(index, src[0])
                    b = shape[0] if shape and shape[0] > 0 else None
                elif op == "OneHot":
                    b = _const_int(index, index.data_inputs[c][1][0])
                else:
                    b = None
                    if c not in seen and op in ("Cast", "Identity", "Reshape", "ExpandDims",
                                                "Squeeze", "StopGradient"):
                        seen.add(c)
                        nxt.append(c)
                if b:
                    bound = b if bound is None else min(bound, b)
        frontier = nxt
    return bound or 2


def _resource_shape(index: GraphIndex, i: int):
    node = index.node(i)
    if "shape" in node.attr:
        return [d.size for d in node.attr["shape"].shape.dim]
    return None


def _const_int(index: GraphIndex, i: int):
    node = index.node(i)
    if index.ops[i] == "Const" and node.attr["value"].tensor.int_val:
        return node.attr["value"].tensor.int_val[0]
    return None


def load_feed_files(pairs: list[str]) -> dict[str, np.ndarray]:
    feeds = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--feed wants NAME=FILE.npy, got {pair!r}")
        try:
            feeds[name] = np.load(Path(path), allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read --feed {path}: {exc}") from None
    return feeds
