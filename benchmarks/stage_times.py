#!/usr/bin/env python
"""Where a memory-policy rewrite spends its time: each stage timed in one process.

Usage::

    python benchmarks/stage_times.py [--nodes 100k] [--shape residual] [--repeats 3]
                                     [--root CHECKOUT]

Builds a synthetic training graph (benchmarks/synthetic.py, as scale_bench.py does) and
runs the stages of `graphmem rewrite --policy memory` one after the other in this process,
with the forked children off (background.py), so that each stage's own cost shows: load,
index, regions, forward facts, checkpoints, the recompute pass, the re-index, the regions
of the rewritten graph, the schedule passes (IdentityN split, loop sums, late terms, early
updates), and the estimates of the rewritten graph and of the original. Each stage is
repeated `--repeats` times on fresh state, and the table shows the lowest wall and CPU
seconds. `--root` puts another checkout's graphmem first on the path: run an older commit
(in a `git worktree`) and this one side by side to compare them.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("load", "index", "regions", "forward facts", "checkpoints", "recompute pass",
          "re-index", "regions (rewritten)", "schedule passes", "estimate (rewritten)",
          "estimate (original)")


def run_once(path: Path, batch: int) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds of each stage of one rewrite."""
    from graphmem import background
    from graphmem.analysis.activations import analyze_forward
    from graphmem.analysis.regions import analyze_regions
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.passes.checkpoints import choose_checkpoints
    from graphmem.passes.early_updates import apply_early_updates
    from graphmem.passes.late_terms import apply_late_terms
    from graphmem.passes.loop_sums import hold_loop_sums
    from graphmem.passes.recompute import apply_recompute
    from graphmem.passes.split_identityn import split_gradient_identityn
    from graphmem.rewrite import RewriteOptions, _estimate

    background.MIN_NODES = 1 << 62  # every stage in this process
    times: dict[str, tuple[float, float]] = {}

    def stage(name: str, fn):
        wall, cpu = time.perf_counter(), time.process_time()
        value = fn()
        times[name] = (time.perf_counter() - wall, time.process_time() - cpu)
        return value

    options = RewriteOptions("memory", batch_size=batch)
    model = stage("load", lambda: load_model(path))
    ws = stage("index", lambda: Workspace.open(model, batch_size=batch))
    index = ws.index
    losses = ws.collection("losses")
    regions = stage("regions", lambda: analyze_regions(index, None, batch, losses))
    facts = stage("forward facts", lambda: analyze_forward(index, regions, set()))
    choice = stage("checkpoints", lambda: choose_checkpoints("memory", index, regions, facts,
                                                             batch, [], []))
    stage("recompute pass", lambda: apply_recompute(index, regions, facts, choice.tensors,
                                                    batch))
    new_index = stage("re-index", ws.reindex)
    new_regions = stage("regions (rewritten)",
                        lambda: analyze_regions(new_index, None, batch, losses))

    def schedule_passes():
        split_gradient_identityn(new_index, new_regions)
        hold_loop_sums(new_index)
        apply_late_terms(new_index, new_regions, batch)
        return apply_early_updates(new_index, new_regions, [], None)

    stage("schedule passes", schedule_passes)
    stage("estimate (rewritten)", lambda: _estimate(ws, new_regions, options))
    ws.index = index  # the original's index: its estimate reads only it and its regions
    stage("estimate (original)", lambda: _estimate(ws, regions, options))
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="100k", help="target node count (default 100k)")
    ap.add_argument("--shape", default="residual", help="chain, residual or branchy")
    ap.add_argument("--repeats", type=int, default=3, help="runs; the lowest counts")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--root", type=Path, help="a checkout whose graphmem to time")
    args = ap.parse_args(argv)
    if args.root is not None:  # its graphmem before any other
        sys.path.insert(0, str(args.root.resolve()))
    if str(ROOT) not in sys.path:  # for `benchmarks`
        sys.path.append(str(ROOT))
    from benchmarks.scale_bench import SHAPES, parse_size, write_meta

    if args.shape not in SHAPES:
        ap.error(f"--shape: one of {', '.join(SHAPES)}")
    import graphmem

    gc.disable()  # as the CLI runs
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "graph.meta"
        facts = write_meta(args.shape, parse_size(args.nodes), path, True)
        runs = [run_once(path, args.batch) for _ in range(max(args.repeats, 1))]
    print(f"graphmem from {Path(graphmem.__file__).parent}; {args.shape} graph of "
          f"{facts['nodes']} nodes; lowest of {len(runs)} runs, forked children off")
    print(f"{'stage':<22} {'wall s':>8} {'CPU s':>8}")
    total_wall = total_cpu = 0.0
    for name in STAGES:
        wall = min(r[name][0] for r in runs)
        cpu = min(r[name][1] for r in runs)
        total_wall, total_cpu = total_wall + wall, total_cpu + cpu
        print(f"{name:<22} {wall:8.3f} {cpu:8.3f}")
    print(f"{'sum':<22} {total_wall:8.3f} {total_cpu:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
