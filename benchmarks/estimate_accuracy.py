"""Is graphmem's estimated peak a bound a user can gate on?

The protocol: each graph is trained in `--processes` fresh processes (4) of `--steps` steps
(110: TF's warm-up, when its executor takes every kernel for expensive, and its steady
state after ~90 runs both), one inter-op thread, and its measured peak is the highest step
of any process after the first step (which holds one-time allocations). The executor's
order of independent ops changes from process to process and from warm-up to steady
state, and with it the peak: a training run's peak is its highest step. The estimate
(`estimated_peak_bytes`, the highest over the executor orders the simulation walks) should
lie within 0.97-1.15 of it; the lowest order's estimate is printed beside it, and each
process's highest step.

Graph sets (`--sets`, comma-separated):
- `fixtures`: the test fixtures (`tests/fixtures/data`);
- `sweep`: the model sweep's builders (benchmarks/model_sweep_models.py);
- `slim`: tf-slim networks at their canonical sizes (AlexNet v2 224, ResNet v1 50 224,
  Inception v1/v3 224/299), needs tf-slim;
- `keras`: Keras applications as TF2 train steps (benchmarks/keras_models_bench.py);
- `unet`: a U-Net with long skips at 256 px (benchmarks/networks_bench.py).

Each graph is measured as is and rewritten with each of `--policies` (original, memory,
speed). The guard check: every rewrite graphmem keeps (not undone because its estimate is
no lower) must measure at most its original's peak (median over processes of each
process's highest step); rows that do not are marked `ABOVE ORIGINAL`.

    python -m benchmarks.estimate_accuracy [--sets fixtures] [--processes 4] [--steps 110]
                                           [--policies original,memory,speed]
                                           [--cache FILE] [--only NAME,...]

`--cache FILE` keeps each measurement under the hash of the graph measured (and the batch,
process and step counts): working on the estimator, later runs measure only graphs that
changed. Measurements belong to the machine that made them (CPU features decide TF's
kernels). CPU only: no GPU was measured with this protocol (see docs/estimator.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.measure import measure
from graphmem.analysis.inspect import gather_facts
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "fixtures" / "data"
LOW, HIGH = 0.97, 1.15  # the band the estimate must lie in, against the highest step
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


@dataclass
class Case:
    """One graph to measure: where it is (or how to build it), its batch and tag."""

    name: str
    batch: int
    path: Path | None = None  # a fixture
    build: list[str] = field(default_factory=list)  # python -c code that builds it at {out}
    suffix: str = ".meta"
    tag: str | None = None


def _fixtures() -> list[Case]:
    cases = [("mlp", "mlp.meta", None), ("resnet", "resnet.meta", None),
             ("transformer", "transformer.meta", None), ("lstm_v1", "lstm_v1.meta", None),
             ("lstm_v2", "lstm_v2.meta", None), ("tf1_saved_model", "tf1_saved_model", "train"),
             ("tf2_saved_model", "tf2_saved_model", None),
             ("tf2_keras", "tf2_keras_saved_model", None)]
    return [Case(name, 64, DATA / rel, tag=tag) for name, rel, tag in cases]


def _sweep() -> list[Case]:
    from benchmarks.model_sweep import MODELS

    return [Case(name, batch, suffix=suffix,
                 build=["-m", "benchmarks.model_sweep_models", name, "{out}"])
            for name, (suffix, batch) in MODELS.items()]


# tf-slim networks at their canonical input sizes, the batch the issue measured at
SLIM = {"alexnet_v2": (224, 8), "resnet_v1_50": (224, 4), "inception_v1": (224, 4),
        "inception_v3": (299, 2)}


def _slim() -> list[Case]:
    code = ("import sys; sys.path.insert(0, '.'); from pathlib import Path; "
            "from benchmarks.slim_models_bench import build; build({name!r}, Path({{out!r}}), "
            "{side})")
    return [Case(name, batch, build=["-c", code.format(name=name, side=side)])
            for name, (side, batch) in SLIM.items()]


def _keras() -> list[Case]:
    from benchmarks.keras_models_bench import APPLICATIONS

    code = ("import sys; sys.path.insert(0, '.'); from pathlib import Path; "
            "from benchmarks.keras_models_bench import build; build({name!r}, Path({{out!r}}))")
    return [Case(name, 8, suffix="", build=["-c", code.format(name=name)])
            for name in APPLICATIONS]


def _unet() -> list[Case]:
    code = ("import sys; sys.path.insert(0, '.'); from pathlib import Path; "
            "from benchmarks.networks_bench import build_unet; build_unet(Path({out!r}), 256)")
    return [Case("unet_256", 4, build=["-c", code])]


SETS = {"fixtures": _fixtures, "sweep": _sweep, "slim": _slim, "keras": _keras,
        "unet": _unet}


@dataclass
class Row:
    name: str
    policy: str
    estimate: int  # the highest over the executor orders
    lowest: int  # the lowest over them
    phase: str
    highest: int  # the highest step measured over every process
    per_process: list[int]  # each process's highest step
    kept: bool  # a rewrite graphmem keeps (not undone)

    @property
    def ratio(self) -> float:
        return self.estimate / self.highest if self.highest else float("nan")

    @property
    def typical(self) -> int:
        """The median over processes of each one's highest step (the guard's measure)."""
        return int(statistics.median(self.per_process)) if self.per_process else 0


def _source(case: Case, tmp: Path) -> Path | None:
    if case.path is not None:
        return case.path
    out = tmp / f"{case.name}{case.suffix}"
    args = [a.format(out=str(out)) if "{out" in a else a for a in case.build]
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True,
                          text=True)
    if done.returncode != 0 or not out.exists():
        print(f"{case.name}: could not build ({done.stderr.strip().splitlines()[-1:]})",
              flush=True)
        return None
    return out


def _estimate(path: Path, batch: int, tag: str | None) -> tuple[int, int, str]:
    ws = Workspace.open(load_model(path, tag=tag), batch_size=batch)
    facts, _ = gather_facts(ws, batch)
    peak = facts.peak or {}
    return (facts.estimated_peak_bytes or 0, peak.get("lowest_bytes", 0),
            peak.get("highest_phase", "steady"))


def _measure(path: Path, case: Case, args, cache: dict) -> dict:
    key = f"{_digest(path)}/{case.batch}/{args.processes}/{args.steps}"
    m = cache.get(key)
    if m is None:
        m = measure(str(path), case.batch, processes=args.processes, steps=args.steps,
                    tag=case.tag, env=ENV)
        if args.cache:
            cache[key] = m
            args.cache.write_text(json.dumps(cache))
    return m


def run_case(case: Case, args, tmp: Path, cache: dict) -> list[Row]:
    src = _source(case, tmp)
    if src is None:
        return []
    rows = []
    for policy in args.policies:
        path, kept = src, False
        if policy != "original":
            path = tmp / f"{case.name}_{policy}{src.suffix if src.is_file() else ''}"
            result = rewrite_file(src, path, RewriteOptions(policy, [], case.batch),
                                  tag=case.tag)
            kept = not result.reverted
            if not kept:
                continue  # written unchanged: the original's row stands for it
        est, low, phase = _estimate(path, case.batch, case.tag)
        m = _measure(path, case, args, cache)
        highests = m.get("highests", m["peaks"])
        rows.append(Row(case.name, policy, est, low, phase, max(highests), highests, kept))
        print(_row(rows[-1], rows[0] if kept else None), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="fixtures", help=f"of {', '.join(SETS)}")
    ap.add_argument("--only", help="names of graphs to run, comma-separated")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--steps", type=int, default=110)
    ap.add_argument("--policies", default="original,memory,speed")
    ap.add_argument("--cache", type=Path, help="JSON file of measurements by graph hash")
    args = ap.parse_args(argv)
    args.policies = args.policies.split(",")
    unknown = [s for s in args.sets.split(",") if s not in SETS]
    if unknown:
        ap.error(f"unknown sets {unknown}; known: {', '.join(SETS)}")
    cache = json.loads(args.cache.read_text()) if args.cache and args.cache.exists() else {}
    cases = [c for s in args.sets.split(",") for c in SETS[s]()]
    if args.only:
        names = set(args.only.split(","))
        cases = [c for c in cases if c.name in names]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            rows.extend(run_case(case, args, Path(tmp), cache))
    print(summary(rows))
    return 0


def summary(rows: list[Row]) -> str:
    """The band and the guard over every row: how many inside, the worst either way."""
    if not rows:
        return "nothing measured"
    inside = [r for r in rows if LOW <= r.ratio <= HIGH]
    below = [r for r in rows if r.ratio < LOW]
    low = min(rows, key=lambda r: r.ratio)
    high = max(rows, key=lambda r: r.ratio)
    originals = {r.name: r for r in rows if r.policy == "original"}
    above = [r for r in rows if r.kept and r.name in originals
             and r.typical > originals[r.name].typical]
    lines = [f"estimate / highest step: {len(inside)} of {len(rows)} within {LOW}-{HIGH}; "
             f"{len(below)} below {LOW}; lowest {low.ratio:.2f} ({low.name} {low.policy}), "
             f"highest {high.ratio:.2f} ({high.name} {high.policy})",
             f"guard: {len(above)} kept rewrites measured above their original"
             + (": " + ", ".join(f"{r.name} {r.policy}" for r in above) if above else "")]
    return "\n".join(lines)


def _digest(path: Path) -> str:
    """A hash of the graph files (a SavedModel's saved_model.pb, not its variables)."""
    files = [path / "saved_model.pb"] if path.is_dir() else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()[:24]


def _row(r: Row, original: Row | None) -> str:
    per = ", ".join(format_bytes(p) for p in sorted(r.per_process))
    flag = "" if LOW <= r.ratio <= HIGH else ("  BELOW" if r.ratio < LOW else "  HIGH")
    line = (f"{r.name:18} {r.policy:8} estimated {format_bytes(r.estimate):>10} "
            f"({r.ratio:.2f}; lowest order {format_bytes(r.lowest)}, peak in {r.phase})  "
            f"highest step {format_bytes(r.highest):>10}  per process: {per}{flag}")
    if original is not None and r.typical > original.typical:
        line += (f"  ABOVE ORIGINAL ({format_bytes(r.typical)} vs "
                 f"{format_bytes(original.typical)})")
    return line


if __name__ == "__main__":
    sys.exit(main())
