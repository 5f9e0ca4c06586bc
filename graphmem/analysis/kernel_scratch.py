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

- Whatever the kernels, a function call TF compiles with XLA (`_XlaMustCompile`: Keras 3
  runs a grouped convolution so on CPU, where TF has no kernel for it, a depthwise one
  included: ConvNeXt's 7x7 convolutions) holds XLA's temporary buffer while it runs. For
  the gradient of a depthwise convolution written as a grouped one (one input channel per
  group), XLA on CPU computes the filter gradient as a dense convolution, [k, k, C, C],
  then keeps its diagonal: one allocation the profiler names no op for, twice the dense
  filter (220.5 MiB in each of Keras ConvNeXtSmall's last-stage blocks, 7 x 7 x 768 x 768
  floats x 2, at any batch size), or up to about twice the input where that is larger.
  Counted as twice the dense filter plus twice the input. With several channels per group
  (a ResNeXt- or RegNet-style block written with Keras 3's `Conv2D(groups=g)`) the filter
  stays grouped: counted as twice the input plus twice the filter.
  `python -m benchmarks.xla_scratch` measures both against the count, one op at a time
  (docs/benchmarks.md, "XLA's buffer for grouped convolution gradients").

The allocator may hand such a buffer a larger free chunk (up to twice the request); this
module gives the request.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import cache

from google.protobuf.message import Message

from graphmem.graph import dtypes
from graphmem.graph.index import GraphIndex, attr_of

_L2_BYTES = 256 << 10  # the kernels' fixed cache sizes (conv_grad_input_ops.h)
_WORKING_SET_BYTES = 30 << 20
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})  # XLA may compile them
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
                  onednn_half: bool | None = None,
                  library: Message | None = None) -> Callable[[int], int]:
    """A function node id -> bytes of scratch its kernel allocates while it runs. With
    oneDNN on, only float16 kernels it cannot run (`onednn_half`, default: as on this
    CPU) are Eigen's and have scratch. Calls of functions XLA compiles (their bodies in
    `library`, default the graph's own) hold XLA's temporary buffer."""
    on = onednn if onednn is not None else onednn_enabled()
    half_on_eigen = on and not (onednn_half if onednn_half is not None
                                else onednn_runs_half())
    xla = xla_call_scratch(index, batch_size,
                           library if library is not None else index.graph_def.library)
    if on and not half_on_eigen:
        return (lambda i: xla.get(i, 0)) if xla else (lambda i: 0)
    ops = index.ops

    def scratch(i: int) -> int:
        op = ops[i]
        if xla and i in xla:
            return xla[i]
        if not has_scratch(op) or (on and index.dtype((i, 0)) != dtypes.HALF):
            return 0  # a kernel without scratch, or oneDNN's
        if op.startswith("Conv2DBackprop"):
            return _conv2d_backprop(index, i, op, batch_size)
        if op == "MaxPoolGrad":
            ins = index.data_inputs[i]
            return 8 * (index.num_elements(ins[1], batch_size) or 0) if len(ins) > 1 else 0
        return 0

    return scratch


def xla_call_scratch(index: GraphIndex, batch_size: int | None,
                     library: Message) -> dict[int, int]:
    """Call node id -> bytes of XLA's temporary buffer, for calls of XLA-compiled functions
    holding a grouped convolution's filter gradient (see the module docstring)."""
    if not library.function:
        return {}
    calls = [i for i, op in enumerate(index.ops) if op in _CALLS]
    if not calls:
        return {}
    bodies = {f.signature.name: f for f in library.function}
    found: dict[int, int] = {}
    for i in calls:
        node = index.node(i)
        body = bodies.get(attr_of(node, "f").func.name)
        if body is None or not (attr_of(node, "_XlaMustCompile").b
                                or ("_XlaMustCompile" in body.attr
                                    and body.attr["_XlaMustCompile"].b)):
            continue
        args = {a.name: k for k, a in enumerate(body.signature.input_arg)}
        ins = index.data_inputs[i]
        best = 0
        for inner in body.node_def:
            if inner.op != "Conv2DBackpropFilter" or not inner.input \
                    or attr_of(inner, "data_format").s not in (b"", b"NHWC"):
                continue
            k = args.get(inner.input[0].split(":")[0])
            shapes = attr_of(inner, "_output_shapes").list.shape
            if k is None or k >= len(ins) or len(shapes) != 1 or len(shapes[0].dim) != 4:
                continue
            kh, kw, per_group, out_channels = (d.size for d in shapes[0].dim)
            x = index.static_shape(ins[k], batch_size)
            itemsize = dtypes.itemsize(index.dtype(ins[k]) or 0)
            if x is None or len(x) != 4 or not itemsize or x[3] <= per_group \
                    or min(kh, kw, per_group, out_channels) <= 0:
                continue  # not a grouped convolution (or sizes unknown)
            # a depthwise one's filter gradient is computed dense, [k, k, C, C]
            filter_bytes = kh * kw * (x[3] if per_group == 1 else per_group) \
                * out_channels * itemsize
            best = max(best, 2 * (filter_bytes + x[0] * x[1] * x[2] * x[3] * itemsize))
        if best:
            found[i] = best
    return found


def has_scratch(op: str) -> bool:
    """Whether kernels of op type `op` may allocate scratch (scratch_model is 0 for the
    others: callers asking per op can skip it by type)."""
    return op.startswith("Conv2DBackprop") or op == "MaxPoolGrad" or op in _CALLS


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
