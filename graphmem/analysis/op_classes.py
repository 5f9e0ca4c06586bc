"""Classes of ops that several analyses and passes reason about.

Kept in one place below the passes so that a policy, the loop passes and the analyses
agree on what counts as, say, an expensive op, without importing each other.
"""

from __future__ import annotations

# ops whose outputs are costly to compute again: the speed policy keeps them, and the loop
# passes (v1 and v2) keep their outputs with the speed policy
EXPENSIVE_OPS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                           "Conv2D", "Conv3D", "Conv1D", "DepthwiseConv2dNative",
                           "Conv2DBackpropInput", "Conv3DBackpropInputV2", "_FusedMatMul",
                           "_FusedConv2D", "_FusedBatchMatMul", "Einsum", "SparseMatMul",
                           "_MklMatMul", "_MklConv2D"})
