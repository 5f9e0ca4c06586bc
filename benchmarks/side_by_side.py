"""Measure graphs that train the same model side by side: the first is the reference.

    python -m benchmarks.side_by_side ORIGINAL REWRITE [REWRITE ...] --batch N
                                      [--threads 1,2] [--rounds 3] [--steps 5]
                                      [--warmup 0]

For comparing two rewrites of one model (two checkouts, two options) without building it
again: each round runs every graph once per thread setting, in turns, each in a fresh
process (`benchmarks.measure`: median step peak above resident memory, first step left
out), so that a machine's slow minute falls on all of them. Prints, per thread setting and
graph, each process's peak, the median's ratio to the first graph's median, the step-time
ratio likewise, the highest step of any process, and whether every process's losses equal
the first graph's (bit for bit: the same feeds and initial values each step). With
`--warmup 100` the median is of the steps after TF's warm-up (its steady state), and the
highest step is over the whole run, warm-up included.

Grappler's default memory optimizer can make a graph's losses differ in their last bits
from one process to the next (the U-Net with long skips: docs/findings.md, "Losses that
change between processes"); the losses column says so when the first graph's own
processes differ, and `--grappler-memory NO_MEM_OPT` turns that optimizer off in every
process, which makes them bit for bit comparable.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.measure import measure
from graphmem.units import format_bytes


def table_unit(reference_bytes: float) -> tuple[float, str, int]:
    """(divisor, unit, decimals) for a table of peaks near `reference_bytes`: whole MiB
    for the large networks, hundredths of a MiB or tenths of a KiB for the small graphs,
    whose peaks differ by less than a MiB (the fixtures' LSTM: 0.6 against 1.2 MiB)."""
    if reference_bytes >= 100 * 2**20:
        return 2**20, "MiB", 0
    if reference_bytes >= 2**20:
        return 2**20, "MiB", 2
    return 2**10, "KiB", 1


def losses_verdict(reference: list[list[float]], losses: list[list[float]]) -> str:
    """Whether every process's losses (`losses`, one list per process) equal the first
    graph's first process's, bit for bit; when they do not and the first graph's own
    processes (`reference`) differ among themselves too, the difference is not the
    graph's: say so rather than a bare DIFFER."""
    if all(x == reference[0] for x in losses):
        return "same"
    if any(x != reference[0] for x in reference[1:]):
        return "differ, as the first graph's own processes do"
    return "DIFFER"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graphs", nargs="+", help="the reference first, then the others")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", default="1,2", help="inter-op thread settings")
    ap.add_argument("--rounds", type=int, default=3, help="processes per graph and setting")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=0,
                    help="steps run before the measured ones (100: TF's steady state)")
    ap.add_argument("--grappler-memory", metavar="LEVEL",
                    help="Grappler's memory optimizer level in every process (NO_MEM_OPT: "
                         "off, so that processes' losses compare bit for bit)")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    # keyed by the graph's place in the list: a graph given twice (a control) is two rows
    runs: dict[tuple[int, int], list[dict]] = {}
    for r in range(a.rounds):
        for t in threads:
            for i, g in enumerate(a.graphs):
                m = measure(g, a.batch, t, a.steps, processes=1, warmup=a.warmup,
                            grappler_memory=a.grappler_memory)
                res = {"peak": m["peak"], "seconds": m["seconds"],
                       "highest": m["highests"][0], "losses": m["losses"][0]}
                runs.setdefault((t, i), []).append(res)
                print(f"round {r + 1}, {t} thread(s), {g}: {format_bytes(res['peak'])}, "
                      f"{res['seconds']:.2f} s", file=sys.stderr, flush=True)
    div, unit, places = table_unit(statistics.median(
        x["peak"] for x in runs[(threads[0], 0)]))
    print(f"| threads | graph | peaks ({unit}) | peak x first | step time x first | highest "
          f"step ({unit}) | losses |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t in threads:
        ref = runs[(t, 0)]
        ref_peak = statistics.median(x["peak"] for x in ref)
        ref_time = statistics.median(x["seconds"] for x in ref)
        for i, g in enumerate(a.graphs):
            rs = runs[(t, i)]
            peak = statistics.median(x["peak"] for x in rs)
            secs = statistics.median(x["seconds"] for x in rs)
            verdict = losses_verdict([x["losses"] for x in ref], [x["losses"] for x in rs])
            peaks = ", ".join(f"{x['peak'] / div:.{places}f}" for x in rs)
            print(f"| {t} | {g} | {peaks} | "
                  f"{peak / ref_peak:.2f} | {secs / ref_time:.2f} | "
                  f"{max(x['highest'] for x in rs) / div:.{places}f} | "
                  f"{verdict} |")


if __name__ == "__main__":
    main()
