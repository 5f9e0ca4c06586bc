"""Where the size of a graph's batch dimension comes from, and whether sizes need it.

Most TF1 graphs feed placeholders of shape [?, ...]: every byte count downstream of them is
unknown until the batch size is. A peak or a ratio computed with those tensors counted as
zero bytes is wrong, so commands whose results depend on sizes ask for the batch size
unless it can be found: given (--batch-size), from a SavedModel signature that fixes it, or
from the leading dimension of a fed array (--feed). A graph whose inputs all have static
shapes needs none.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.errors import UsageError
from graphmem.graph import dtypes
from graphmem.graph.workspace import Workspace
from graphmem.units import format_shape

# the ops a step's data comes in by (a TF2 train step's arguments are _Arg ops); a
# PlaceholderWithDefault counts too: fed or not, its leading dim sizes what reads it
_INPUT_OPS = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
                        "IteratorGetNext", "IteratorGetNextSync", "QueueDequeue",
                        "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2",
                        "QueueDequeueUpTo", "QueueDequeueUpToV2", "_Arg"})
_HANDLES = (dtypes.RESOURCE, dtypes.VARIANT)


@dataclass
class BatchSize:
    """The batch size sizes are computed with, and where it came from."""
    size: int | None  # None: no input has an unknown leading dim, or it stays unknown
    source: str  # "--batch-size", "signature", "--feed", "not needed" or "unknown"
    unknown_inputs: list[tuple[str, list[int] | None]]  # inputs of unknown leading dim

    @property
    def needed(self) -> bool:
        """Whether sizes depend on a batch dimension that is still unknown."""
        return self.size is None and bool(self.unknown_inputs)

    def describe_unknown(self) -> str:
        """`x:0 is [?, 64]`, the first input whose leading dimension is unknown."""
        if not self.unknown_inputs:
            return ""
        name, shape = self.unknown_inputs[0]
        more = len(self.unknown_inputs) - 1
        return f"{name} is {format_shape(shape)}" + (f", and {more} more" if more else "")


def unknown_batch_inputs(ws: Workspace) -> list[tuple[str, list[int] | None]]:
    """Data inputs of the graph (placeholders, iterators, a train step's arguments) whose
    leading dimension is unknown, as (tensor name, shape). One pass over the nodes."""
    index = ws.index
    found = []
    for i, op in enumerate(index.ops):
        if op not in _INPUT_OPS:
            continue
        types = index.out_dtypes[i] or ()
        for k, shape in enumerate(index.shapes_of(i) or ()):
            if k < len(types) and dtypes.base(types[k]) in _HANDLES:
                continue
            if shape and shape[0] < 0:
                found.append((f"{index.names[i]}:{k}", shape))
    return found


def resolve_batch_size(ws: Workspace, given: int | None,
                       feeds: dict | None = None) -> BatchSize:
    """The batch size to compute sizes with: `given`, else one the model fixes (a signature
    input, a fed array), else None (`needed` says whether that leaves sizes unknown)."""
    unknown = unknown_batch_inputs(ws)
    if given is not None:
        return BatchSize(given, "--batch-size", unknown)
    if not unknown:
        return BatchSize(None, "not needed", unknown)
    from_feeds = _from_feeds(unknown, feeds or {})
    if from_feeds is not None:
        return BatchSize(from_feeds, "--feed", unknown)
    from_signature = _from_signatures(ws)
    if from_signature is not None:
        return BatchSize(from_signature, "signature", unknown)
    return BatchSize(None, "unknown", unknown)


def require_batch_size(ws: Workspace, given: int | None, feeds: dict | None = None,
                       backward_scopes: list[str] | None = None) -> int | None:
    """`resolve_batch_size`, or a usage error (exit 2) that asks for --batch-size when sizes
    depend on a batch dimension nothing fixes: never a result computed from unknown sizes.
    A graph that is no training graph at all says so first (a batch size would not help)."""
    batch = resolve_batch_size(ws, given, feeds)
    if batch.needed:
        from graphmem.analysis.regions import analyze_regions

        analyze_regions(ws.index, backward_scopes)  # raises for a graph with no backward pass
        raise UsageError(missing_batch_message(batch))
    return batch.size


def missing_batch_message(batch: BatchSize) -> str:
    return (f"tensor sizes depend on an unknown batch dimension ({batch.describe_unknown()});"
            " give it with --batch-size N")


def _from_feeds(unknown, feeds: dict) -> int | None:
    """The leading dim of the first fed array for an input of unknown leading dim."""
    for name, _ in unknown:
        value = feeds.get(name, feeds.get(name.rsplit(":", 1)[0]))
        shape = getattr(value, "shape", None)
        if shape:
            return int(shape[0])
    return None


def _from_signatures(ws: Workspace) -> int | None:
    """The batch size a SavedModel's signatures fix: the leading dim of their inputs, when
    they all that have one agree on it."""
    meta = ws.model.meta_graph
    if meta is None:
        return None
    sizes = set()
    for sig in meta.signature_def.values():
        for info in sig.inputs.values():
            shape = info.tensor_shape
            if shape.unknown_rank or not shape.dim:
                continue
            if shape.dim[0].size > 0:
                sizes.add(shape.dim[0].size)
    return sizes.pop() if len(sizes) == 1 else None
