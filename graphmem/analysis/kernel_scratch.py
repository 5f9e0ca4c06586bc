"""Scratch memory CPU kernels allocate while they run, and which kernels TF picks.

A kernel's `allocate_temp` buffers come from the same allocator as its outputs and count in
the measured peak, but no graph shows them. Measured on TF 2.21 (step_stats traces of
single ops and of the fixtures, intra-op threads 1 as `graphmem verify` runs; the kernels'
own source ships with TF in `tensorflow/include/tensorflow/core/kernels/`):

- With oneDNN off (TF's default on CPUs without AVX512-VNNI/BF16, AVX-VNNI or AMX), the
  convolution gradients are TF's "custom" kernels. `Conv2DBackpropInput` computes
  out_backprop x filter^T into a column buffer of [shard, output pixels, filter size]
  (conv_grad_input_ops.h): one image at a time when the batch is 1 or one image's work is
  at least the L2 size (256 KiB), else as many images as fit a 30 MiB working set, so a
  small layer asks for up to 30 MiB however small it is (traced: 19.5 MB for an 8x8x32
  layer at batch 32). `Conv2DBackpropFilter` builds the same column buffer of the input
  and always shards by the working set. `MaxPoolGrad` keeps the argmax of every pooled
  value as int64. Everything else a training step runs was traced at a few KB at most
  (depthwise convolution gradients, batch norm, softmax cross entropy, matmuls).
- With oneDNN on, Grappler hands convolutions to oneDNN kernels, whose scratch was traced
  at about 8 KB: nothing is counted. Except float16: oneDNN runs DT_HALF only on CPUs with
  AVX512-FP16 or AMX-FP16 (or AVX-NE-CONVERT), elsewhere TF falls back to Eigen's kernels
  ("oneDNN supports DT_HALF only on platforms with AVX-512"), and a mixed_float16 model's
  convolution gradients take the column buffers above (traced: 32 MiB for each of a small
  Keras CNN's, whose step the estimate had at 0.4 MiB).

The allocator may hand such a buffer a larger free chunk (up to twice the request); this
module gives the request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import cache

from graphmem.graph import dtypes
from graphmem.graph.index import GraphIndex, attr_of

_L2_BYTES = 256 << 10  # the kernels' fixed cache sizes (conv_grad_input_ops.h)
_WORKING_SET_BYTES = 30 << 20
_ONEDNN_CPU_FLAGS = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                     "amx_bf16")
_ONEDNN_HALF_FLAGS = ("avx512_fp16", "amx_fp16", "avx_ne_convert")  # oneDNN runs DT_HALF


@cache
def onednn_enabled() -> bool:
    """Whether TensorFlow on this machine runs oneDNN kernels: TF_ENABLE_ONEDNN_OPTS when
    set, else TF's default on Linux (DefaultOneDnnPolicy in tensorflow/core/util/util.cc):
    on for CPUs with neural-network instructions, read from /proc/cpuinfo."""
    env = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    if not sys.platform.startswith("linux"):
        return sys.platform.startswith("win")
    return any(f in _cpu_flags() for f in _ONEDNN_CPU_FLAGS)


@cache
def onednn_runs_half() -> bool:
    """Whether oneDNN, when on, runs float16 kernels on this CPU (TF's
    IsDataTypeSupportedByOneDNNOnThisCPU); elsewhere they are Eigen's."""
    return any(f in _cpu_flags() for f in _ONEDNN_HALF_FLAGS)


@cache
def _cpu_flags() -> frozenset[str]:
    if not sys.platform.startswith("linux"):
        return frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def scratch_model(index: GraphIndex, batch_size: int | None,
                  onednn: bool | None = None,
                  onednn_half: bool | None = None) -> Callable[[int], int]:
    """A function node id -> bytes of scratch its kernel allocates while it runs. With
    oneDNN on, only float16 kernels it cannot run (`onednn_half`, default: as on this
    CPU) are Eigen's and have scratch."""
    on = onednn if onednn is not None else onednn_enabled()
    half_on_eigen = on and not (onednn_half if onednn_half is not None
                                else onednn_runs_half())
    if on and not half_on_eigen:
        return lambda i: 0
    ops = index.ops

    def scratch(i: int) -> int:
        op = ops[i]
        if not has_scratch(op) or (on and index.dtype((i, 0)) != dtypes.HALF):
            return 0  # a kernel without scratch, or oneDNN's
        if op.startswith("Conv2DBackprop"):
            return _conv2d_backprop(index, i, op, batch_size)
        if op == "MaxPoolGrad":
            ins = index.data_inputs[i]
            return 8 * (index.num_elements(ins[1], batch_size) or 0) if len(ins) > 1 else 0
        return 0

    return scratch


def has_scratch(op: str) -> bool:
    """Whether kernels of op type `op` may allocate scratch (scratch_model is 0 for the
    others: callers asking per op can skip it by type)."""
    return op.startswith("Conv2DBackprop") or op == "MaxPoolGrad"


def _conv2d_backprop(index: GraphIndex, i: int, op: str, batch_size: int | None) -> int:
    ins = index.data_inputs[i]
    if len(ins) < 3 or attr_of(index.node(i), "data_format").s not in (b"", b"NHWC"):
        return 0  # the custom kernels are NHWC only
    out_backprop = index.shape(ins[2])
    filter_shape = index.shape(ins[1]) if op.startswith("Conv2DBackpropInput") \
        else index.shape((i, 0))
    itemsize = dtypes.itemsize(index.dtype((i, 0)) or 0)
    if out_backprop is None or filter_shape is None or len(out_backprop) != 4 \
            or len(filter_shape) != 4 or not itemsize:
        return 0
    batch = out_backprop[0] if out_backprop[0] >= 0 else batch_size
    if batch is None or min(out_backprop[1:]) < 0 or min(filter_shape) < 0:
        return 0
    pixels = out_backprop[1] * out_backprop[2]
    filter_size = filter_shape[0] * filter_shape[1] * filter_shape[2]
    depth = out_backprop[3]
    work = pixels * depth + filter_size * depth + pixels * filter_size
    if work <= 0:
        return 0
    if op.startswith("Conv2DBackpropInput") and (batch == 1 or work >= _L2_BYTES // itemsize):
        shard = 1  # one image at a time, the matmul itself parallel
    else:
        shard = -(-(_WORKING_SET_BYTES // itemsize) // work)
    return shard * pixels * filter_size * itemsize
