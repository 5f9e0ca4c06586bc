"""Read any supported model file into a LoadedModel, choosing the graph to work on.

Format detection looks at the path first and the bytes second, because `.pbtxt` and `.meta`
files are written both as text and as binary in the wild.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import DecodeError, Message
from google.protobuf.text_format import ParseError

from graphmem import protos
from graphmem.errors import InputError
from graphmem.formats.files import check_tree, stat_input
from graphmem.formats.model import Format, LoadedModel
from graphmem.graph.function_view import functions_named

SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")
_META_TEXT_FIELDS = ("meta_info_def", "graph_def", "saver_def", "collection_def", "signature_def",
                     "asset_file_def", "object_graph_def")
_BACKWARD_MARKERS = ("gradients/", "gradient_tape/")


def detect_format(path: Path) -> Format:
    if path.is_dir():
        return Format.SAVED_MODEL
    name = path.name.lower()
    if name in SAVED_MODEL_FILES:
        return Format.SAVED_MODEL
    head = _head_text(path)
    looks_meta_text = head is not None and head.lstrip().startswith(_META_TEXT_FIELDS)
    if name.endswith(".meta"):
        return Format.META_TEXT if looks_meta_text else Format.META
    if name.endswith((".pbtxt", ".txt", ".prototxt")):
        return Format.META_TEXT if looks_meta_text else Format.GRAPHDEF_TEXT
    if name.endswith((".pb", ".graphdef")):
        return Format.GRAPHDEF
    if head is not None:
        return Format.META_TEXT if looks_meta_text else Format.GRAPHDEF_TEXT
    raise InputError(
        f"cannot tell the format of {path}: expected .meta, .pb, .pbtxt or a SavedModel "
        "directory; pass --format"
    )


def _head_text(path: Path) -> str | None:
    """The file's first bytes as text, or None when they are binary."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4096)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(ch in text for ch in "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x0e\x0f\x10\x12\x1a"):
        return None
    return text


def _parse(data: bytes, message: Message, text: bool, path: Path, what: str) -> Message:
    try:
        if text:
            protos.parse_text(data.decode("utf-8"), message)
        else:
            message.ParseFromString(data)
    except (DecodeError, ParseError, UnicodeDecodeError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path} is not a valid {what}: {reason}") from None
    return message


def read_file_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def load_model(
    path: str | Path,
    fmt: Format | str | None = None,
    tag: str | None = None,
    function: str | None = None,
) -> LoadedModel:
    path = Path(path)
    stat_input(path)  # before any read: a named pipe would block it
    fmt = Format(fmt) if fmt else detect_format(path)
    if fmt == Format.SAVED_MODEL:
        model = _load_saved_model(path, tag)
    else:
        if path.is_dir():
            raise InputError(f"{path} is a directory, but --format {fmt.value} expects a file")
        data = read_file_bytes(path)
        if fmt in (Format.META, Format.META_TEXT):
            meta = _parse(data, protos.MetaGraphDef(), fmt.is_text, path, "MetaGraphDef")
            if not meta.graph_def.node:
                raise InputError(f"{path} is not a MetaGraphDef with a graph (no nodes found)")
            model = LoadedModel(path, fmt, meta, meta.graph_def, meta_graph=meta)
        else:
            graph = _parse(data, protos.GraphDef(), fmt.is_text, path, "GraphDef")
            if not graph.node:
                raise InputError(f"{path} is not a GraphDef with nodes (empty or another format)")
            model = LoadedModel(path, fmt, graph, graph)
    model.function_name = _choose_function(model, function)
    return model


def load_message(message: Message, function: str | None = None,
                 name: str = "<in-memory>") -> LoadedModel:
    """A GraphDef or MetaGraphDef already in memory (the library API's models), as
    `load_model` would read it from a file. The message is copied into graphmem's own
    classes (TensorFlow's are accepted: messages cross as bytes), so the caller's object
    is never edited; `name` stands for the path in reports."""
    kind = getattr(getattr(message, "DESCRIPTOR", None), "full_name", None)
    if kind == "tensorflow.MetaGraphDef":
        meta = protos.MetaGraphDef()
        meta.ParseFromString(message.SerializeToString())
        if not meta.graph_def.node and not meta.graph_def.library.function:
            raise InputError(f"{name} is not a MetaGraphDef with a graph (no nodes found)")
        model = LoadedModel(Path(name), Format.META, meta, meta.graph_def, meta_graph=meta)
    elif kind == "tensorflow.GraphDef":
        graph = protos.GraphDef()
        graph.ParseFromString(message.SerializeToString())
        if not graph.node and not graph.library.function:
            raise InputError(f"{name} is a GraphDef with no nodes")
        model = LoadedModel(Path(name), Format.GRAPHDEF, graph, graph)
    else:
        raise InputError(f"expected a path, a GraphDef or a MetaGraphDef, got "
                         f"{kind or type(message).__name__}")
    model.function_name = _choose_function(model, function)
    return model


def _load_saved_model(path: Path, tag: str | None) -> LoadedModel:
    directory = path if path.is_dir() else path.parent
    pb, pbtxt = directory / SAVED_MODEL_FILES[0], directory / SAVED_MODEL_FILES[1]
    if pb.exists() or pbtxt.exists():
        check_tree(directory)  # all of it is copied to the output
    if pb.exists():
        saved = _parse(read_file_bytes(pb), protos.SavedModel(), False, pb, "SavedModel")
        text = False
    elif pbtxt.exists():
        saved = _parse(read_file_bytes(pbtxt), protos.SavedModel(), True, pbtxt, "SavedModel")
        text = True
    else:
        raise InputError(f"{directory} is not a SavedModel directory (no saved_model.pb)")
    if not saved.meta_graphs:
        raise InputError(f"{directory} holds a SavedModel with no MetaGraphDef")
    tag_sets = [tuple(m.meta_info_def.tags) for m in saved.meta_graphs]
    listing = "; ".join(",".join(t) or "(no tags)" for t in tag_sets)
    if tag is None:
        if len(tag_sets) > 1:
            raise InputError(f"{directory} has {len(tag_sets)} MetaGraphDefs; choose one with "
                             f"--tag (tags: {listing})")
        index = 0
    else:
        wanted = {t.strip() for t in tag.split(",") if t.strip()}
        matches = [i for i, t in enumerate(tag_sets) if set(t) == wanted]
        if not matches:
            matches = [i for i, t in enumerate(tag_sets) if wanted <= set(t)]
        if len(matches) != 1:
            why = "no" if not matches else "more than one"
            raise InputError(f"{why} MetaGraphDef in {directory} has tags {tag!r} "
                             f"(tags: {listing})")
        index = matches[0]
    meta = saved.meta_graphs[index]
    return LoadedModel(directory, Format.SAVED_MODEL, saved, meta.graph_def, meta_graph=meta,
                       meta_graph_index=index, tags=tag_sets[index], saved_model_text=text)


def training_functions(graph_def: Message) -> list[str]:
    """Functions of the library that hold a backward pass (TF2 train steps). A function that
    another such function calls (a loop's body or condition, their gradients, an If branch,
    a PartitionedCall target) is part of that step, never a step of its own: a gradient
    loop's body holds `gradients/` ops too."""
    library = graph_def.library.function
    found = {f.signature.name for f in library
             if any(_is_backward_name(n.name) for n in f.node_def)}
    called: set[str] = set()
    for fdef in library:
        if fdef.signature.name in found:
            for node in fdef.node_def:
                called |= functions_named(node)
    return sorted(found - called or found)


def _is_backward_name(name: str) -> bool:
    return name.startswith(_BACKWARD_MARKERS) or any(
        f"/{m}" in name for m in _BACKWARD_MARKERS
    ) or name.startswith("gradients_")


def _choose_function(model: LoadedModel, function: str | None) -> str | None:
    candidates = training_functions(model.graph_def)
    if function is not None:
        names = {f.signature.name for f in model.graph_def.library.function}
        if function in names:
            return function
        prefixed = sorted(n for n in names if function in n)
        if len(prefixed) == 1:
            return prefixed[0]
        shown = ", ".join(candidates or sorted(names)[:20]) or "none"
        raise InputError(f"no function {function!r} in the graph's library "
                         f"(training functions: {shown})")
    # gradient ops come after the forward pass in a graph's node list: from the end, the
    # first few names answer (from the front, a 100k-node graph's forward half is read)
    if any(_is_backward_name(n.name) for n in reversed(model.graph_def.node)):
        return None
    if len(candidates) == 1:
        return candidates[0]
    if len(candidates) > 1:
        raise InputError("the graph's library holds several training functions; choose one "
                         f"with --function ({', '.join(candidates)})")
    library = model.graph_def.library.function
    if model.format == Format.SAVED_MODEL and library and not any(
            n.op.startswith(_UPDATE_PREFIXES) for n in model.graph_def.node):
        # nothing trains at the top level either: an inference-only export (Keras's
        # `model.save` keeps the call functions, not the train step)
        raise InputError(f"{model.path} holds no train step: none of its {len(library)} "
                         "functions computes gradients (an inference-only export, such as "
                         "Keras's model.save); save a tf.Module whose tf.function computes "
                         "and applies the gradients")
    return None


_UPDATE_PREFIXES = ("Apply", "ResourceApply", "Assign", "SparseApply", "ResourceSparseApply")
