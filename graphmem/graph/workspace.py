"""The graph a command works on, in canonical GraphDef form, with its index.

A TF1 graph is worked on in place; a library function (TF2 train step) is converted to a
canonical GraphDef by FunctionView and written back by `commit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from graphmem.formats.model import LoadedModel
from graphmem.graph.function_view import FunctionView
from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry


@dataclass
class Workspace:
    model: LoadedModel
    registry: OpRegistry
    graph_def: Message
    view: FunctionView | None
    index: GraphIndex
    shapes_from_tensorflow: bool = False

    @classmethod
    def open(cls, model: LoadedModel, infer_shapes: bool = True) -> Workspace:
        registry = OpRegistry.for_graph(model.graph_def, model.meta_graph)
        view = None
        graph_def = model.graph_def
        if model.function is not None:
            view = FunctionView.build(model.function, registry)
            graph_def = view.graph_def
        ws = cls(model, registry, graph_def, view, GraphIndex.build(graph_def, registry))
        if infer_shapes and not ws.index.has_shapes() and view is None:
            from graphmem.runtime.shape_inference import infer_shapes as tf_infer

            shapes, types = tf_infer(graph_def)
            ws.index.set_shapes(shapes, types)
            ws.shapes_from_tensorflow = True
        return ws

    def collection(self, key: str) -> list[str]:
        """Names held by a MetaGraphDef collection (node_list), e.g. `losses`, `train_op`."""
        meta = self.model.meta_graph
        if meta is None or key not in meta.collection_def:
            return []
        return list(meta.collection_def[key].node_list.value)

    def reindex(self) -> GraphIndex:
        self.index = _rebuild(self.index, self.graph_def, self.registry)
        return self.index

    def commit(self) -> None:
        """Write the canonical graph back into the model's container."""
        if self.view is not None:
            self.view.write_back()


def _rebuild(old: GraphIndex, graph_def: Message, registry: OpRegistry) -> GraphIndex:
    new = GraphIndex.build(graph_def, registry)
    if not any(s is not None for s in new.out_shapes[: len(old)]) and old.has_shapes():
        for i in range(len(new)):
            j = old.id_of.get(new.names[i])
            if j is not None:
                new.out_shapes[i] = old.out_shapes[j]
                if new.out_dtypes[i] is None:
                    new.out_dtypes[i] = old.out_dtypes[j]
    return new
