#!/usr/bin/env python
"""Which plan the memory policy writes at several values of its tolerance, per network.

Usage::

    python benchmarks/memory_tolerance.py [--models vgg_16,keras_MobileNet,...]
        [--tolerances 0.03,0.02,0.01] [--batch N] [--json FILE]

The memory policy writes, of the plans within `MEMORY_TOLERANCE` of the lowest estimated
peak, the one with the least recompute (graphmem/passes/budget.py). Changing the tolerance
changes plans on some networks and not on others; this prints, for each network (built as
benchmarks/networks_bench.py builds it, at its canonical size), the plan each tolerance
would write, from one set of candidates: one `graphmem.rewrite` per network, with the
policy's pick (`_memory_pick`) repeated at each tolerance over the same candidates (its
late-copies variants are estimated again for each). Estimates only: nothing is trained.
Measure the plans that change with benchmarks/side_by_side.py.

Batch sizes: 32, the U-Net's 4, the transformer LM's 16 and the LSTM LM's 20, as in
docs/benchmarks.md; `--batch` sets one for all.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.networks_bench import KERAS, SIDES, _build  # noqa: E402

MIB = 2 ** 20
BATCHES = {"unet": 4, "keras_transformer_lm": 16, "keras_lstm_lm": 20}
DEFAULT_MODELS = ("resnet_v1_50,resnet_v2_50,inception_v1,inception_v2,inception_v3,vgg_16,"
                  "vgg_19,alexnet_v2,overfeat,unet,keras_ResNet50,keras_ResNet50V2,"
                  "keras_MobileNet,keras_MobileNetV2,keras_VGG16")


def picks(path: Path, batch: int, tolerances: list[float]) -> dict[float, dict]:
    """The plan the memory policy would write at each tolerance: estimated peak (MiB, the
    ranking estimate plans are chosen by), recompute as a share of the forward FLOPs, and
    modelled step time at 1 | 2 inter-op threads."""
    import graphmem
    import graphmem.passes.budget as budget
    from graphmem.analysis.cost import forward_flops

    pick = budget._memory_pick
    found: dict[float, dict] = {}

    def each_tolerance(index, regions, batch_size, runs, runner, base_times=None):
        forward = forward_flops(index, regions, batch_size)
        kept = budget.MEMORY_TOLERANCE
        results = {}
        try:  # the project's own tolerance last, so that its pick is what gets applied
            for tolerance in dict.fromkeys([*tolerances, kept]):
                budget.MEMORY_TOLERANCE = tolerance
                results[tolerance] = pick(index, regions, batch_size, runs, runner,
                                          base_times)
        finally:
            budget.MEMORY_TOLERANCE = kept
        for tolerance in tolerances:
            best = results[tolerance].best
            times = best.after.step_times
            found[tolerance] = {
                "peak_mib": round(best.after.peak_bytes / MIB, 1),
                "recompute": round(best.extra_flops / forward, 3) if forward else None,
                "modelled_step": None if times is None or base_times is None
                else [round(t, 2) for t in times.ratio(base_times)],
            }
        return results[kept]

    budget._memory_pick = each_tolerance
    try:
        graphmem.rewrite(str(path), None, "memory", batch_size=batch, check=False)
    finally:
        budget._memory_pick = pick
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--tolerances", default="0.03,0.02,0.01")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    tolerances = [float(t) for t in args.tolerances.split(",")]
    rows = {}
    print("| network (batch) | " + " | ".join(f"tolerance {t:.1%}" for t in tolerances) + " |")
    print("| --- " * (len(tolerances) + 1) + "|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = Path(tmp) / (name if name.startswith(KERAS) else f"{name}.meta")
            failed = _build(name, SIDES[name], path, False)
            if failed:
                print(f"| {name} | not built: {failed} |", flush=True)
                continue
            batch = args.batch or BATCHES.get(name, 32)
            rows[name] = found = picks(path, batch, tolerances)
            cells = []
            for t in tolerances:
                p = found.get(t)
                if p is None:
                    cells.append("no memory search")
                    continue
                share = "?" if p["recompute"] is None else f"{p['recompute']:.0%}"
                step = "" if p["modelled_step"] is None else \
                    " at {} \\| {}x".format(*p["modelled_step"])
                cells.append(f"{p['peak_mib']} MiB, {share} recomputed{step}")
            print(f"| {name} ({batch}) | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
