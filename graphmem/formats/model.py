"""What a loaded model is: the file's own container plus the one graph the tool works on."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message


class Format(str, enum.Enum):
    META = "meta"  # binary MetaGraphDef
    META_TEXT = "meta_text"  # text MetaGraphDef (export_meta_graph(as_text=True))
    GRAPHDEF = "graphdef"  # binary GraphDef (.pb)
    GRAPHDEF_TEXT = "graphdef_text"  # text GraphDef (.pbtxt)
    SAVED_MODEL = "saved_model"  # directory with saved_model.pb (or .pbtxt)

    @property
    def is_text(self) -> bool:
        return self in (Format.META_TEXT, Format.GRAPHDEF_TEXT)


@dataclass
class LoadedModel:
    """A model file and the graph selected in it.

    `container` is the proto as it was read (MetaGraphDef, GraphDef or SavedModel) and is what
    gets written back; `graph_def` and `meta_graph` point inside it, so edits made through them
    land in the container. When `function_name` is set, the graph is that FunctionDef of
    `graph_def.library` (a TF2 `tf.function` train step) rather than the top-level graph.
    """

    path: Path
    format: Format
    container: Message
    graph_def: Message
    meta_graph: Message | None = None
    meta_graph_index: int | None = None  # which MetaGraphDef of a SavedModel
    tags: tuple[str, ...] = ()
    function_name: str | None = None
    saved_model_text: bool = False  # the SavedModel was saved_model.pbtxt

    @property
    def function(self) -> Message | None:
        if self.function_name is None:
            return None
        for fdef in self.graph_def.library.function:
            if fdef.signature.name == self.function_name:
                return fdef
        return None

    def describe(self) -> str:
        where = f"{self.path} ({self.format.value}"
        if self.tags:
            where += f", tags {','.join(self.tags)}"
        if self.function_name:
            where += f", function {self.function_name}"
        return where + ")"
