"""The graph a command works on, in canonical GraphDef form, with its index.

A TF1 graph is worked on in place; a library function (TF2 train step) is converted to a
canonical GraphDef by FunctionView and written back by `commit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from graphmem.formats.model import LoadedModel
from graphmem.graph.function_view import FunctionView
from graphmem.graph.index import GraphIndex
from graphmem.graph.names import original_name
from graphmem.graph.opdef_check import check_graph
from graphmem.graph.opdefs import OpRegistry


@dataclass
class Workspace:
    model: LoadedModel
    registry: OpRegistry
    graph_def: Message
    view: FunctionView | None
    index: GraphIndex
    shapes_from_tensorflow: bool = False
    shape_overrides: dict | None = None  # shapes TensorFlow inferred, by node name
    # library functions a pass edited in place (loop bodies), their bytes before the first
    # edit: undoing a rewrite of a TF2 train step restores them (its graph is one function)
    function_backup: dict[str, bytes] = field(default_factory=dict)

    @classmethod
    def open(cls, model: LoadedModel, infer_shapes: bool = True,
             batch_size: int | None = None) -> Workspace:
        """Index the model's graph. Shapes come from the graph, or from TensorFlow when the
        graph carries none."""
        registry = OpRegistry.for_graph(model.graph_def, model.meta_graph)
        view = None
        graph_def = model.graph_def
        if model.function is not None:
            view = FunctionView.build(model.function, registry)
            graph_def = view.graph_def
        ws = cls(model, registry, graph_def, view, GraphIndex.build(graph_def, registry))
        check_graph(ws.index, model.graph_def.versions.producer > 0)  # as TF's import would
        if infer_shapes and view is None and not ws.index.has_shapes():
            ws._infer_shapes(batch_size)
        return ws

    def refine_shapes(self, nodes: set[int], batch_size: int | None) -> bool:
        """Ask TensorFlow for static shapes, with the batch size fixed, when outputs of
        `nodes` stay unknown without it (reshapes computed from `tf.shape`). Returns whether
        shapes changed; without TensorFlow, sizes stay unknown and are reported as such."""
        if (self.view is not None or not batch_size or self.shape_overrides is not None
                or not self.index.has_inner_unknown_dims(nodes) or not _tf_available()):
            return False
        self._infer_shapes(batch_size)
        return True

    def _infer_shapes(self, batch_size: int | None) -> None:
        from graphmem.runtime.shape_inference import infer_shapes as tf_infer

        shapes, types = tf_infer(self.graph_def, batch_size)
        self.index.set_shapes(shapes, types, override=True)
        self.shape_overrides = shapes
        self.shapes_from_tensorflow = True

    def collection(self, key: str) -> list[str]:
        """Names held by a MetaGraphDef collection (node_list), e.g. `losses`, `train_op`."""
        meta = self.model.meta_graph
        if meta is None or key not in meta.collection_def:
            return []
        return list(meta.collection_def[key].node_list.value)

    def reindex(self, appended: bool = True) -> GraphIndex:
        """Rebuild the index after a pass; inferred shapes carry over to copies of an op.
        `appended`: the pass only added nodes and edited inputs (every graphmem pass), so
        per-node facts of the nodes already indexed are reused; False after the graph was
        replaced (undoing a rewrite)."""
        self.index = GraphIndex.build(self.graph_def, self.registry,
                                      self.index if appended else None)
        if self.shape_overrides:
            by_copy = {n: self.shape_overrides.get(original_name(n))
                       for n in self.index.names}
            self.index.set_shapes({k: v for k, v in by_copy.items() if v is not None}, {},
                                  override=True)
        return self.index

    def commit(self) -> None:
        """Write the canonical graph back into the model's container."""
        if self.view is not None:
            self.view.write_back()


def _tf_available() -> bool:
    from graphmem.runtime.tf_loader import available

    return available()
