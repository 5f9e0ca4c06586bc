"""How graphmem's step-time model prices each class of op against the kernel time TF
measures: `python -m benchmarks.op_class_times MODEL [MODEL ...] --batch N`.

graphmem's modelled step time (analysis/cost.py `op_times`: an op's FLOPs plus BYTE_COST
per byte it reads and writes; analysis/schedule.py adds them up for one inter-op thread and
walks two) decides which plans the memory policy may write (budget.py's step-time cap).
Its error is what matters there: a recompute plan copies forward ops, so when the model
prices forward convolutions, batch norms or poolings wrongly against the backward pass, the
modelled cost of recompute is wrong too. This traces one step (`--step`, by default the
third: in TF's warm-up every kernel is dispatched, so the profiler records them all) at one
inter-op thread and prints, per class of op, the measured kernel seconds and share of the
step's kernel time beside the modelled share, and the measured seconds per modelled unit
relative to forward convolutions' (1.00: priced as the model prices a forward convolution;
2.00: twice as slow per modelled unit). Kernels are matched to classes by their op type,
so what Grappler fuses into a convolution (a bias, an activation) counts as convolution on
the measured side and as what it was on the modelled side.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass

from benchmarks.profiled_step import kernels, profiled_steps, step_ops

CLASSES = ("conv_forward", "filter_gradient", "input_gradient", "matmul", "batch_norm",
           "batch_norm_gradient", "pooling", "other")


def op_class(op_type: str) -> str:
    """The class of an op type, a graph's ("Conv2DBackpropFilter") or a kernel's as the
    profiler names it ("_MklNativeConv2DBackpropFilterWithBias", "_MklNativeFusedConv2D")."""
    if "BackpropFilter" in op_type:
        return "filter_gradient"
    if "BackpropInput" in op_type:
        return "input_gradient"
    if "Conv" in op_type:
        return "conv_forward"
    if "MatMul" in op_type:
        return "matmul"
    if "BatchNorm" in op_type:
        return "batch_norm_gradient" if "Grad" in op_type else "batch_norm"
    if "Pool" in op_type:
        return "pooling"
    return "other"


@dataclass
class ClassTimes:
    measured: dict[str, float]  # class -> kernel seconds of the traced step
    modelled: dict[str, float]  # class -> cost.op_times units of the step

    def rows(self) -> list[tuple[str, float, float, float, float | None]]:
        """(class, measured seconds, measured share, modelled share, seconds per unit
        relative to forward convolutions' or None) for every class either side has."""
        m_total = sum(self.measured.values()) or 1.0
        u_total = sum(self.modelled.values()) or 1.0
        conv_m, conv_u = self.measured.get("conv_forward", 0.0), \
            self.modelled.get("conv_forward", 0.0)
        ref = conv_m / conv_u if conv_m and conv_u else None
        out = []
        for c in CLASSES:
            m, u = self.measured.get(c, 0.0), self.modelled.get(c, 0.0)
            if not m and not u:
                continue
            rel = m / u / ref if ref and u else None
            out.append((c, m, m / m_total, u / u_total, rel))
        return out


def measured_by_class(path: str, batch: int, step: int) -> dict[str, float]:
    """Kernel seconds per class of one traced step at one inter-op thread."""
    found: Counter = Counter()
    for space in profiled_steps(path, batch, 1, step, host_tracer_level=2)[1]:
        for start, end, name in kernels(space):
            found[op_class(name.rsplit(":", 1)[1])] += (end - start) / 1e12
    return dict(found)


def modelled_by_class(path: str, batch: int) -> dict[str, float]:
    """cost.op_times units per class over the step's ops."""
    from graphmem.analysis.cost import op_times

    index, nodes = step_ops(path, batch)
    times = op_times(index, nodes, batch)
    found: Counter = Counter()
    for i in nodes:
        found[op_class(index.ops[i])] += times[i]
    return dict(found)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--step", type=int, default=3, help="the step traced (1 = the first)")
    a = ap.parse_args()
    print("| model | class | measured kernel time | measured share | modelled share | "
          "per modelled unit, x forward convolutions' |")
    print("| --- | --- | --- | --- | --- | --- |")
    for path in a.models:
        times = ClassTimes(measured_by_class(path, a.batch, a.step),
                           modelled_by_class(path, a.batch))
        for c, m, m_share, u_share, rel in times.rows():
            rel_text = "-" if rel is None else f"{rel:.2f}"
            print(f"| {path} | {c} | {m:.3f} s | {m_share:.1%} | {u_share:.1%} | {rel_text} |",
                  flush=True)


if __name__ == "__main__":
    sys.exit(main())
