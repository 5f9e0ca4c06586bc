"""The graph as TensorFlow will run it: Grappler's default passes applied offline.

A session rewrites the graph before the first step (constant folding, op fusion, pruning);
estimating on that graph accounts for buffers that fusion removes. TF1 graphs only: Grappler
needs a MetaGraphDef naming the fetches (the train op).
"""

from __future__ import annotations

from google.protobuf.message import Message

from graphmem import protos
from graphmem.errors import UsageError
from graphmem.runtime.tf_loader import rejects_as_input_error, tensorflow


def grappler_graph(meta_graph: Message | None, graph_def: Message, fetches: list[str]) -> Message:
    """Our GraphDef message for `graph_def` after Grappler's default optimizations."""
    if meta_graph is None:
        meta_graph = protos.MetaGraphDef()
    tensorflow("Grappler runs inside TensorFlow")
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2  # noqa: PLC0415
    from tensorflow.python.grappler import tf_optimizer  # noqa: PLC0415

    meta = meta_graph_pb2.MetaGraphDef.FromString(meta_graph.SerializeToString())
    meta.graph_def.ParseFromString(graph_def.SerializeToString())
    if not fetches:
        raise UsageError("estimating on Grappler's graph needs the train op (fetch)")
    meta.collection_def["train_op"].node_list.value[:] = fetches
    with rejects_as_input_error("Grappler cannot optimize the graph"):
        optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    ours = protos.GraphDef()
    ours.ParseFromString(optimized.SerializeToString())
    return ours
