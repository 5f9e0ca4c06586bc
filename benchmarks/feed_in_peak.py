"""Does a TF1 step's NumPy feed count in the step peak TF's allocator reports?
`python -m benchmarks.feed_in_peak [--feed-mib 25] [--buffer-mib 50]`.

graphmem's floor (graphmem/analysis/floor.py) counts a feed only where an op reads it,
and docs/estimator.md gap (6) says the measured peak never counts it. This measures it as
`graphmem verify` measures a step (`TF_CPU_ALLOCATOR_USE_BFC=true`, the peak above what was
resident, after a first step): a placeholder of FEED MiB is read, then a BUFFER MiB tensor
is made, then the placeholder is read again, so the feed is live across the buffer. Fed
from an array aligned to 64 bytes (which TF may alias) and from one that is not (which
it copies); each row prints the step's peak beside the buffer's own size. A peak of the
buffer's chunk alone (its size rounded up to the allocator's first region: 64 MiB for 50)
whatever the feed's size means the feed is not in the statistics.
"""

from __future__ import annotations

import argparse
import os

MIB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--feed-mib", type=int, default=25)
    ap.add_argument("--buffer-mib", type=int, default=50)
    args = ap.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TF's first import
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    n = args.feed_mib * MIB // 4
    x = v1.placeholder(tf.float32, [n])
    first = tf.reduce_sum(x)
    with tf.control_dependencies([first]):
        buffer = tf.random.uniform([args.buffer_mib * MIB // 4])
    with tf.control_dependencies([buffer]):
        again = tf.reduce_max(x)  # the feed is read after the buffer exists
    out = tf.reduce_sum(buffer) + first + again
    session = v1.Session()
    raw = np.ones(n + 16, np.float32)
    start = next(k for k in range(16) if raw[k:].ctypes.data % 64 == 0)
    feeds = {"aligned to 64 bytes": raw[start:start + n],
             "not aligned": raw[start + 1:start + 1 + n]}
    print(f"| feed ({args.feed_mib} MiB) | step peak above resident | the buffer alone |")
    print("| --- | --- | --- |")
    for label, array in feeds.items():
        session.run(out, {x: array})
        before = tf.config.experimental.get_memory_info("CPU:0")["current"]
        tf.config.experimental.reset_memory_stats("CPU:0")
        session.run(out, {x: array})
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
        print(f"| {label} | {peak / MIB:.1f} MiB | {args.buffer_mib} MiB |")


if __name__ == "__main__":
    main()
