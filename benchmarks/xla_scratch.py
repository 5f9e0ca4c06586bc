"""XLA's temporary buffer for a grouped convolution's filter gradient, measured against what
graphmem counts: `python -m benchmarks.xla_scratch [--threads 2]`.

Keras 3 runs grouped convolutions on CPU through a function TF compiles with XLA; a call of
it holds XLA's buffer while it runs (graphmem/analysis/kernel_scratch.py, docs/estimator.md
gap 5). For each case (batch, side, channels, kernel, channels per group) a jit-compiled
`Conv2DBackpropFilter` runs once to compile, then again with the allocator's statistics
reset: its peak above what was resident, less the filter gradient it returns, is the
buffer. Beside it, `xla_call_scratch` on the graph of a function that calls the compiled
one (the call TF writes, `_XlaMustCompile` and all).
"""

from __future__ import annotations

import argparse
import os

# (batch, side, channels, kernel, channels per group): depthwise (1 per group) and grouped
CASES = [(8, 7, 768, 7, 1), (8, 7, 384, 7, 1), (8, 14, 384, 7, 1), (2, 7, 768, 7, 1),
         (8, 7, 768, 3, 1), (8, 7, 768, 5, 1), (8, 56, 96, 7, 1), (8, 28, 192, 7, 1),
         (32, 56, 96, 7, 1), (8, 112, 32, 3, 1),
         (8, 14, 256, 3, 2), (8, 14, 256, 3, 8), (8, 14, 256, 3, 16), (8, 14, 256, 3, 64),
         (8, 14, 768, 3, 48), (8, 7, 768, 7, 48), (8, 28, 256, 3, 16), (32, 14, 256, 3, 16),
         (8, 14, 768, 3, 8)]
MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TF's first import
    import numpy as np
    import tensorflow as tf

    from graphmem.analysis.kernel_scratch import xla_call_scratch
    from graphmem.graph.index import GraphIndex
    from graphmem.graph.opdefs import OpRegistry

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    print("| batch, side, channels, kernel, per group | measured buffer | counted | counted / measured |")
    print("| --- | --- | --- | --- |")
    for n, h, c, k, g in CASES:
        x, dy = tf.ones([n, h, h, c]), tf.ones([n, h, h, c])

        @tf.function(jit_compile=True)
        def filter_grad(x, dy, k=k, g=g, c=c):
            return tf.raw_ops.Conv2DBackpropFilter(
                input=x, filter_sizes=[k, k, g, c], out_backprop=dy, strides=[1, 1, 1, 1],
                padding="SAME")

        filter_grad(x, dy)
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        out = filter_grad(x, dy)
        measured = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before \
            - int(np.prod(out.shape)) * 4
        del out

        @tf.function
        def caller(x, dy):
            return filter_grad(x, dy)

        graph_def = caller.get_concrete_function(x, dy).graph.as_graph_def(add_shapes=True)
        index = GraphIndex.build(graph_def, OpRegistry.for_graph(graph_def, None))
        counted = sum(xla_call_scratch(index, n, graph_def.library).values())
        print(f"| {n}, {h}, {c}, {k}, {g} | {measured / MIB:.2f} MiB | {counted / MIB:.2f} MiB"
              f" | {counted / measured:.2f} |", flush=True)


if __name__ == "__main__":
    main()
