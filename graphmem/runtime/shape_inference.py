"""Static shapes from TensorFlow: for graphs saved without `_output_shapes`, and to resolve
dimensions that stay unknown until the batch size is known (reshapes computed from `tf.shape`).
"""

from __future__ import annotations

from google.protobuf.message import Message

from graphmem.runtime.tf_loader import rejects_as_input_error, tensorflow


def infer_shapes(graph_def: Message, batch_size: int | None = None
                 ) -> tuple[dict[str, list[list[int] | None]], dict[str, list[int]]]:
    """Shapes and dtypes of every op's outputs; with `batch_size`, placeholders get it as
    their unknown leading dimension first, so shapes computed from it become static."""
    tf = tensorflow("TensorFlow infers the shapes the graph does not carry")
    tf_graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
    for node in tf_graph_def.node:
        node.attr.pop("_output_shapes", None)
        if batch_size and node.op in ("Placeholder", "PlaceholderV2") and "shape" in node.attr:
            dims = node.attr["shape"].shape.dim
            if dims and dims[0].size < 0:
                dims[0].size = batch_size
    graph = tf.Graph()
    with graph.as_default(), rejects_as_input_error():
        tf.compat.v1.import_graph_def(tf_graph_def, name="")
    shapes: dict[str, list[list[int] | None]] = {}
    types: dict[str, list[int]] = {}
    for op in graph.get_operations():
        out = []
        for t in op.outputs:
            dims = t.shape.as_list() if t.shape.rank is not None else None
            out.append(None if dims is None else [-1 if d is None else d for d in dims])
        shapes[op.name] = out
        types[op.name] = [t.dtype.as_datatype_enum for t in op.outputs]
    return shapes, types
