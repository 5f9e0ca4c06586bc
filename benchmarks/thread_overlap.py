"""How much of a step runs ops side by side: `python -m benchmarks.thread_overlap MODEL`.

Trains MODEL (any format `graphmem verify` runs) for `--step` steps at `--threads`
inter-op threads and records the last under TensorFlow's profiler (host level 2: every
kernel TF counts as expensive). Prints the step's wall time split by how many kernels ran
at once (0, 1, 2, ...), each op type's total kernel time, and the ops that ran alone
longest: where a second inter-op thread bought nothing. Run it on an original and on its
rewrite to see which of the rewrite's ops lost the overlap the original had (a recompute
segment, or two gradient ops an ordering edge put one after the other); graphmem's
two-thread walk (analysis/schedule.py) models the same thing, and this is what it is
checked against.

    python -m benchmarks.thread_overlap MODEL --batch N [--threads 2] [--step 3] [--top 15]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass

from benchmarks.profiled_step import kernels, profiled_steps


@dataclass
class Overlap:
    step_seconds: float
    by_running: dict[int, float]  # kernels running at once -> seconds of the step
    by_type: list[tuple[str, float]]  # op type -> seconds of kernel time, largest first
    alone: list[tuple[str, float]]  # op -> seconds it ran with no other kernel, longest first


def overlap(kernels: list[tuple[int, int, str]], step_seconds: float, top: int) -> Overlap:
    """The step's time by kernels running at once, and each kernel's time alone."""
    edges = sorted([(s, 1, i) for i, (s, _, _) in enumerate(kernels)] +
                   [(e, -1, i) for i, (_, e, _) in enumerate(kernels)])
    running: set[int] = set()
    by_running: Counter = Counter()
    alone: Counter = Counter()
    last = None
    for t, d, i in edges:
        if last is not None and t > last:
            by_running[len(running)] += t - last
            if len(running) == 1:
                (only,) = running
                alone[kernels[only][2]] += t - last
        if d == 1:
            running.add(i)
        else:
            running.discard(i)
        last = t
    by_type: Counter = Counter()
    for s, e, name in kernels:
        by_type[name.rsplit(":", 1)[1]] += e - s
    ps = 1e12
    return Overlap(step_seconds, {k: v / ps for k, v in sorted(by_running.items())},
                   [(k, v / ps) for k, v in by_type.most_common(top)],
                   [(k, v / ps) for k, v in alone.most_common(top)])


def trace(path: str, batch: int, threads: int, step: int, top: int) -> Overlap:
    (record,), (space,) = profiled_steps(path, batch, threads, step, host_tracer_level=2)
    found = kernels(space)
    if not found:
        raise SystemExit("no kernels were recorded")
    return overlap(found, record.seconds, top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step", type=int, default=3, help="the step traced (1 = the first)")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    o = trace(a.model, a.batch, a.threads, a.step, a.top)
    print(f"step: {o.step_seconds:.2f} s (under the profiler)")
    print("kernels running at once: " +
          ", ".join(f"{k}: {v:.2f} s" for k, v in o.by_running.items()))
    print("kernel time by op type: " + ", ".join(f"{k} {v:.2f} s" for k, v in o.by_type))
    print("ran alone longest:")
    for name, secs in o.alone:
        print(f"  {secs:6.2f} s  {name}")


if __name__ == "__main__":
    sys.exit(main())
