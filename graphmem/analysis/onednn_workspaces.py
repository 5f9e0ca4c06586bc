"""Workspaces oneDNN's forward kernels hand to their gradients: buffers no graph shows.

Where TF runs oneDNN's kernels (kernel_scratch.onednn_enabled), its layout pass gives some
forward ops an extra output that only their gradient reads, and which lives from the
forward op to that gradient, a whole backward pass on the early layers. Traced on tf-slim
ResNet-50 v2 at 224 px, batch 32 (`python -m benchmarks.trace_peak`, TF 2.21, the CPU
allocator's records of each allocation, 2026-12-03), untouched, 126 MiB of the 2186 MiB
asked for at the step's peak were these:

- a max pooling whose gradient is computed (`_MklMaxPool`, read by `_MklMaxPoolGrad`)
  keeps the position of each pooled value, one byte per output element (a 1-D tensor of
  as many bytes: 6.1 MiB for the [32, 56, 56, 64] pool1). oneDNN keeps it as 32-bit
  integers for windows of more than 255 elements;
- a batch norm in training mode merged with its `Relu` (Grappler's remapper makes the pair
  `_FusedBatchNormEx`, which oneDNN runs) keeps the ReLU's mask as its `reserve_space_3`:
  one bit per element, held as that many 32-bit floats, so an eighth of a float32 output
  (12.25 MiB beside each [32, 56, 56, 256] output). Unmerged, or with oneDNN off, that
  output is empty.

The remapper merges a batch norm with its `Relu` only when the relu is the one reader of
its output 0 and neither has control edges; float32 and bfloat16 only. Each pair found
here is counted only when a gradient reads it (a max pooling's gradient reading the
pooling's output, a batch norm's gradient reading its reserve spaces), from the forward
op to the last of those gradients. Cost: one pass over the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.kernel_fusions import merged_with_relu
from graphmem.graph import dtypes
from graphmem.graph.index import GraphIndex, attr_of

POOLS = frozenset({"MaxPool", "MaxPool3D"})
POOL_GRADIENTS = frozenset({"MaxPoolGrad", "MaxPool3DGrad"})
BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
BATCH_NORM_GRADIENTS = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2",
                                  "FusedBatchNormGradV3"})
_RESERVE_SPACES = (3, 4, 5)  # a batch norm gradient's inputs read from the forward op
_ONEDNN_TYPES = frozenset({dtypes.FLOAT, dtypes.BFLOAT16})
_BYTE_INDEX_WINDOW = 255  # oneDNN keeps a pooled value's position in one byte up to here


@dataclass
class Workspaces:
    """Forward op -> bytes of its workspace, and gradient op -> the forward ops whose
    workspace it reads (each workspace is freed after the last of its readers)."""

    bytes_of: dict[int, int] = field(default_factory=dict)
    read_by: dict[int, list[int]] = field(default_factory=dict)  # forward op -> readers
    reads: dict[int, list[int]] = field(default_factory=dict)  # reader -> forward ops

    def __bool__(self) -> bool:
        return bool(self.bytes_of)


def onednn_workspaces(index: GraphIndex, batch_size: int | None) -> Workspaces:
    """The workspaces of the graph's forward ops, as TF runs them with oneDNN on (the
    caller decides whether it is)."""
    found = Workspaces()
    ops = index.ops
    for g, op in enumerate(ops):
        if op in POOL_GRADIENTS:
            ins = index.data_inputs[g]
            if len(ins) > 1:
                _add(found, index, index.under_identities(ins[1])[0], g, batch_size)
        elif op in BATCH_NORM_GRADIENTS:
            ins = index.data_inputs[g]
            for slot in _RESERVE_SPACES:
                if slot < len(ins):
                    f, k = index.under_identities(ins[slot])
                    if k in _RESERVE_SPACES:
                        _add(found, index, f, g, batch_size)
                        break
    return found


def _add(found: Workspaces, index: GraphIndex, f: int, reader: int,
         batch_size: int | None) -> None:
    if f not in found.bytes_of:
        b = _workspace_bytes(index, f, batch_size)
        if not b:
            return
        found.bytes_of[f] = b
    if reader not in found.read_by.setdefault(f, []):
        found.read_by[f].append(reader)
        found.reads.setdefault(reader, []).append(f)


def _workspace_bytes(index: GraphIndex, f: int, batch_size: int | None) -> int:
    op = index.ops[f]
    if index.dtype((f, 0)) not in _ONEDNN_TYPES:
        return 0
    elements = index.num_elements((f, 0), batch_size)
    if not elements:
        return 0
    if op in POOLS:
        window = 1
        for k in attr_of(index.node(f), "ksize").list.i:
            window *= k
        return elements * (1 if window <= _BYTE_INDEX_WINDOW else 4)
    if op in BATCH_NORMS and merged_with_relu(index, f):
        return 4 * -(-elements // 8)
    return 0
