"""`graphmem.function`: a live TF2 train step, rewritten in process.

A custom training loop's `tf.function` already is a FunctionDef in the eager context: the
SavedModel route (export, rewrite the file, load it back) only moves that FunctionDef through
a file, and loads a second copy of the weights. Here the concrete function traced for the
example arguments is rewritten by the same driver the CLI runs on a SavedModel's train step
(`rewrite_workspace` on a FunctionView of it), registered in the eager context under a new
name, and called with the original's own captured inputs: the same variables, optimizer
slots and resources, no copy of anything.

What is supported, and what is not:
- a `tf.function` (or a bound method that is one) whose concrete function for the example
  arguments computes gradients and applies them; called eagerly, outside a GradientTape
  (the rewritten call is not recorded on a tape: a train step is not differentiated);
- arguments of the traced signature only: other shapes or dtypes raise `SignatureMismatch`
  (trace with `tf.TensorSpec`s whose batch dimension is None to accept any batch size);
- library functions the step calls (loop bodies, nested tf.functions) are rewritten with it
  when a pass edits them, under new names; the originals stay registered and untouched, so
  the original `tf.function` keeps running as before.
- not supported: XLA-compiled functions (`jit_compile=True`), calls under a distribution
  strategy's replica context, and steps whose concrete function has no backward pass.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from graphmem.errors import GraphmemError, InputError, UsageError

_SUFFIX = "_graphmem"
_counter = itertools.count(1)


class SignatureMismatch(GraphmemError, TypeError):
    """A rewritten function was called with arguments of another signature than the one
    it was traced (and rewritten) for."""


@dataclass
class _Traced:
    """What the rewrite needs of a concrete function: its library (the function and the
    functions it calls, with `_output_shapes`) and its name in it."""

    library_bytes: bytes
    name: str
    batch_size: int | None


def function(tf_function: Any, *example_args: Any, policy: str = "memory",
             **options: Any) -> RewrittenFunction:
    """Rewrite the concrete function of `tf_function` for the example arguments' signature
    and return a callable that runs the rewritten step on the same variables.

    `policy` and `options` are `graphmem.rewrite`'s (the CLI's rewrite options): `swap`,
    `checkpoints`, `early_updates`, `loop_bodies`, `budget`, `batch_size` (default: the
    leading dimension of the first example argument with one) ... `step.report` is the
    RewriteResult: checkpoints, copied ops, estimated peaks before and after.

    Example arguments may be tensors, arrays or `tf.TensorSpec`s (a spec with a None batch
    dimension makes one rewritten function serve every batch size)."""
    from graphmem import api
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow("graphmem.function traces the train step")
    get = getattr(tf_function, "get_concrete_function", None)
    if get is None:
        raise UsageError("graphmem.function wants a tf.function (decorate the train step "
                         f"with @tf.function); got {type(tf_function).__name__}")
    kwargs = options.pop("example_kwargs", None) or {}
    for key in ("output", "format", "tag_set", "tag", "function", "plot"):
        if key in options:
            raise UsageError(f"graphmem.function takes no {key!r} option: the step is "
                             "rewritten in memory")
    concrete = get(*example_args, **kwargs)
    if getattr(concrete.function_def.attr.get("_XlaMustCompile"), "b", False):
        raise UsageError("graphmem.function cannot rewrite an XLA-compiled function "
                         "(jit_compile=True): XLA plans its own memory")
    traced = _trace(tf, concrete, example_args)
    if "batch_size" not in options and traced.batch_size:
        options["batch_size"] = traced.batch_size
    container = _graph_def(traced.library_bytes)
    report = api.rewrite(container, policy=policy, function=traced.name, **options)
    rewritten = report.rewritten
    atomic, registered = _register(rewritten, traced.name, container,
                                   concrete.inference_fn.function_type)
    return RewrittenFunction(concrete, atomic, report, registered)


def _trace(tf, concrete, example_args) -> _Traced:
    """The concrete function and its callees as a GraphDef library with shapes: the
    function added to an empty graph and exported with `add_shapes`, as a SavedModel
    export does (the passes size tensors from `_output_shapes`)."""
    graph = tf.Graph()
    with graph.as_default():
        concrete.add_to_graph(graph)
    graph_def = graph.as_graph_def(add_shapes=True)
    name = concrete.function_def.signature.name
    batch = None
    for arg in tf.nest.flatten(example_args):
        shape = getattr(arg, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] is not None:
            batch = int(shape[0])
            break
    return _Traced(graph_def.SerializeToString(), name, batch)


def _graph_def(data: bytes):
    from graphmem import protos

    graph_def = protos.GraphDef()
    graph_def.ParseFromString(data)
    return graph_def


def _register(rewritten, name: str, original, function_type) -> tuple[Any, list[str]]:
    """Register the rewritten function, and the library functions the rewrite edited,
    under new names in the eager context (the originals stay, for the original
    tf.function); returns the rewritten function's AtomicFunction and the names added."""
    from tensorflow.core.framework import function_pb2
    from tensorflow.python.eager import context
    from tensorflow.python.eager.polymorphic_function import atomic_function

    before = {f.signature.name: f.SerializeToString(deterministic=True)
              for f in original.library.function} if original is not rewritten else {}
    functions = {f.signature.name: f for f in rewritten.library.function}
    if name not in functions:
        raise InputError(f"the rewrite lost function {name}")
    tag = f"{_SUFFIX}_{next(_counter)}"
    edited = {n for n, f in functions.items()
              if n == name or before.get(n) != f.SerializeToString(deterministic=True)}
    renames = {n: n + tag for n in edited}
    ctx = context.context()
    registered: list[str] = []
    concrete_def = None
    for fname in _callees_first(functions, edited):
        fdef = function_pb2.FunctionDef.FromString(functions[fname].SerializeToString())
        fdef.signature.name = renames[fname]
        _rename_calls(fdef, renames)
        if fname == name:
            concrete_def = fdef
            continue
        ctx.add_function_def(fdef)
        registered.append(fdef.signature.name)
    atomic = atomic_function.from_function_def(concrete_def, function_type)
    return atomic, registered


def _callees_first(functions: dict, names: set[str]) -> list[str]:
    """`names` ordered so that a function comes after the edited functions it calls (the
    runtime resolves calls when a function is instantiated, but registering callees first
    keeps every added definition complete)."""
    from graphmem.graph.function_view import functions_named

    order: list[str] = []
    seen: set[str] = set()

    def visit(n: str) -> None:
        stack = [(n, iter(_calls(functions[n], functions_named) & names))]
        seen.add(n)
        while stack:
            top, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                order.append(top)
            elif nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, iter(_calls(functions[nxt], functions_named) & names)))

    for n in sorted(names):
        if n not in seen:
            visit(n)
    return order


def _calls(fdef, functions_named) -> set[str]:
    out: set[str] = set()
    for node in fdef.node_def:
        out |= functions_named(node)
        out.add(node.op)
    return out


def _rename_calls(fdef, renames: dict[str, str]) -> None:
    """Point the function's calls of edited functions (attrs naming them, or nodes whose
    op is a library function) at their new names."""
    for node in fdef.node_def:
        if node.op in renames:
            node.op = renames[node.op]
        for value in node.attr.values():
            kind = value.WhichOneof("value")
            if kind == "func" and value.func.name in renames:
                value.func.name = renames[value.func.name]
            elif kind == "list":
                for f in value.list.func:
                    if f.name in renames:
                        f.name = renames[f.name]


class RewrittenFunction:
    """The rewritten train step: call it as the original tf.function, with arguments of
    the signature it was traced for. `report` is the rewrite's RewriteResult."""

    def __init__(self, concrete, atomic, report, registered: list[str]) -> None:
        self.concrete = concrete  # the original's concrete function (its captures)
        self._atomic = atomic
        self.report = report
        self._registered = registered
        self.name = atomic.name.decode()

    @property
    def function_def(self):
        """The rewritten FunctionDef as the runtime holds it."""
        return self._atomic.definition

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from tensorflow.python.eager.polymorphic_function import function_type_utils

        function_type = self.concrete.function_type
        try:
            bound = function_type_utils.canonicalize_function_inputs(args, kwargs,
                                                                      function_type)
            flat = function_type.unpack_inputs(bound)
        except (TypeError, ValueError) as exc:
            raise SignatureMismatch(
                f"the rewritten function was traced for {self._signature()}; these "
                f"arguments do not fit it ({str(exc).splitlines()[0]}). Call "
                "graphmem.function again with examples of this signature, or trace "
                "with tf.TensorSpec(shape=[None, ...]) to accept any batch size") from None
        outputs = self._atomic.call_flat(*flat, *self.concrete.captured_inputs)
        return function_type.pack_output(outputs)

    def _signature(self) -> str:
        args, kwargs = self.concrete.structured_input_signature
        return ", ".join([_spec_text(a) for a in args] +
                         [f"{k}={_spec_text(v)}" for k, v in kwargs.items()])

    def __repr__(self) -> str:
        return f"<graphmem.RewrittenFunction {self.name} ({self._signature()})>"


def _spec_text(spec: Any) -> str:
    shape = getattr(spec, "shape", None)
    dtype = getattr(spec, "dtype", None)
    if shape is None or dtype is None:
        return repr(spec)
    return f"{dtype.name}{list(shape.as_list()) if shape.rank is not None else '[...]'}"


__all__ = ["RewrittenFunction", "SignatureMismatch", "function"]
