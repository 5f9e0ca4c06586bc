"""Static shapes from TensorFlow, for graphs saved without `_output_shapes`."""

from __future__ import annotations

from google.protobuf.message import Message

from graphmem.runtime.tf_loader import tensorflow


def infer_shapes(graph_def: Message) -> tuple[dict[str, list[list[int] | None]], dict[str, list[int]]]:
    tf = tensorflow("the graph carries no _output_shapes; TensorFlow infers them")
    tf_graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
    graph = tf.Graph()
    with graph.as_default():
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
