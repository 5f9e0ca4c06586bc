"""Which kernels TF's executor runs inline in its steady state:
`python -m benchmarks.inline_ops MODEL [MODEL ...] --batch N [--step 105]`.

TF times each kernel and, once its cost estimate (which starts at 1e8 cycles and decays by a
tenth per run) is under 8000 cycles, runs it inline instead of dispatching it as a task.
The profiler's host tracer at level 2 records only the kernels TF counts as expensive, so a
step traced after the warm-up tells which ops of the graph were inline then. Each model is
trained `--step - 1` steps, then three steps are traced; an op traced in any of them counts
as expensive. Printed per class of op (element-wise, reductions) and bucket of bytes moved
(inputs and outputs at the batch size): how many ops were traced and how many not. Ops
Grappler folds or fuses away are never traced, so the "not traced" counts are upper bounds.
The estimate takes ops of at most 4 KiB for inline ones in its steady order
(graphmem/analysis/schedule.py); see docs/estimator.md, gap 1e.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

from benchmarks.profiled_step import events, profiled_steps, step_ops

ELEMENTWISE = {"Mul", "AddV2", "Sub", "RealDiv", "Relu6", "Relu6Grad", "ReluGrad", "Relu",
               "AddN", "Sqrt", "Square", "Rsqrt", "RsqrtGrad", "Neg", "SquaredDifference",
               "BiasAdd", "SelectV2", "Cast", "Maximum", "Minimum", "Tanh", "Sigmoid",
               "TanhGrad", "SigmoidGrad", "Exp", "Log", "Pow"}
REDUCTIONS = {"Sum", "Mean", "Prod", "Max", "BiasAddGrad", "L2Loss"}
BUCKETS = [0, 1 << 10, 4 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 1 << 40]


def traced_ops(path: str, batch: int, step: int) -> set[str]:
    """Names (as in the graph) of the ops the profiler traced as expensive."""
    found: set[str] = set()
    for space in profiled_steps(path, batch, 1, step, count=3, host_tracer_level=2)[1]:
        for _, _, _, name in events(space, "tf_"):
            if ":" in name and not name.startswith("Memory"):
                op = name.rsplit(":", 1)[0]
                found.add(op.replace("StatefulPartitionedCall/", "", 1))
    return found


def counts(path: str, batch: int, traced: set[str]) -> dict:
    """(class, bucket) -> [not traced, traced] over the ops of the step."""
    index, step = step_ops(path, batch)
    sizes = index.output_sizes(batch)
    out: dict = defaultdict(lambda: [0, 0])
    for i in step:
        op = index.ops[i]
        kind = "element-wise" if op in ELEMENTWISE else "reduction" if op in REDUCTIONS \
            else None
        if kind is None:
            continue
        moved = sum(b or 0 for b in sizes[i]) + sum(
            sizes[s][k] or 0 for s, k in index.data_inputs[i] if k < len(sizes[s]))
        bucket = next(lo for lo, hi in zip(BUCKETS, BUCKETS[1:], strict=False) if moved < hi)
        out[(kind, bucket)][index.names[i] in traced] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--step", type=int, default=105, help="the first step traced")
    a = ap.parse_args()
    total: dict = defaultdict(lambda: [0, 0])
    for path in a.models:
        for key, (inline, expensive) in counts(path, a.batch,
                                               traced_ops(path, a.batch, a.step)).items():
            total[key][0] += inline
            total[key][1] += expensive
    print("| ops | bytes moved | not traced (inline) | traced (expensive) | inline share |")
    print("| --- | --- | --- | --- | --- |")
    for (kind, lo), (inline, expensive) in sorted(total.items()):
        hi = BUCKETS[BUCKETS.index(lo) + 1]
        span = f"{lo >> 10}-{hi >> 10} KiB" if hi < BUCKETS[-1] else f"{lo >> 10} KiB and more"
        print(f"| {kind} | {span} | {inline} | {expensive} | "
              f"{inline / (inline + expensive):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
