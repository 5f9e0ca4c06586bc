#!/usr/bin/env python
"""Sweep graphmem over model classes the test fixtures do not cover, end to end through the CLI.

Usage::

    python benchmarks/model_sweep.py [--models a,b] [--keep DIR] [--steps 3] [--jobs 1]
                                     [--no-verify] [--no-synthetic] [--no-bad-inputs]

For each model (built in a fresh process by `benchmarks/model_sweep_models.py`, in a temporary
directory): `graphmem inspect`, then `graphmem rewrite` with `--policy memory`,
`--policy speed`, `--swap` and `--policy budget --budget 0.6`, and `graphmem verify --exact`
of each rewrite against the original at `--threads 1` and `--threads 2`, then `graphmem
verify` once with Grappler on, as training runs. Printed per variant: exit codes, whether
training was bit-identical at both thread settings (and the same with Grappler on), the
estimated peak after / before, the measured peak rewritten / original at 1 | 2 threads, and
the first error line (or `TRACEBACK` when a command printed one). Then synthetic ~100k-node
graphs (inspect and rewrite only, timed) and bad inputs, each of which must exit 2 with one
`graphmem: error:` line on stderr and leave no output behind.

This is a script, not a test: flags in the last column (`TRACEBACK`, `DIFFERS`,
`DIFFERS WITH GRAPPLER`, `GROWS`
when the measured peak grew by more than 10% at both thread settings, `BAD-ERROR` for a bad
input handled wrongly) are what to look at. About 15-25 minutes for everything on 2 busy
cores; `--jobs 2` runs two models at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from graphmem.api import ROUNDING  # noqa: E402 (above it, a difference is not rounding)

# name -> (file suffix, batch size)
MODELS: dict[str, tuple[str, int]] = {
    "tf1_vgg_bn": (".meta", 8),
    "tf1_unet_tr": (".meta", 8),
    "tf1_transformer_tied": (".meta", 8),
    "tf1_gru_v1": (".meta", 8),
    "tf1_gru_v2": (".meta", 8),
    "tf1_cond_v1": (".meta", 16),
    "tf1_cond_v2": (".meta", 16),
    "tf1_devices": (".meta", 32),
    "k_transformer": ("", 8),
    "k_unet": ("", 8),
    "k_mobilenetv2": ("", 8),
    "k_vgg16": ("", 4),
    "k_gru": ("", 8),
    "k_custom_grad": ("", 16),
    "k_clip": ("", 16),
    "k_mixed": ("", 8),
}
VARIANTS: dict[str, list[str]] = {
    "memory": ["--policy", "memory"],
    "speed": ["--policy", "speed"],
    "swap": ["--swap"],
    "budget0.6": ["--policy", "budget", "--budget", "0.6"],
}
GROWTH = 1.10  # measured peak ratio above which a rewrite "grows" (noise is ~5-10%)
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}


@dataclass
class Row:
    model: str
    variant: str
    exit: str = ""
    same: str = ""
    est_x: str = ""
    meas_x: str = ""
    seconds: float = 0.0
    error: str = ""
    flags: list[str] = field(default_factory=list)


def graphmem() -> list[str]:
    return [sys.executable, "-m", "graphmem.cli"]


def run(argv: list[str], timeout: float = 1800) -> tuple[int, str, str, float]:
    start = time.perf_counter()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=ENV,
                           cwd=ROOT)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        code, out, err = -9, "", f"timeout after {timeout:.0f} s"
    return code, out, err, time.perf_counter() - start


def error_line(code: int, err: str) -> str:
    if "Traceback" in err:
        lines = [x for x in err.strip().splitlines() if x.strip()]
        return "TRACEBACK: " + (lines[-1] if lines else "")
    if code not in (0,):
        lines = [x for x in err.strip().splitlines() if x.strip()]
        return lines[-1] if lines else ""
    return ""


def _json(out: str) -> dict | None:
    try:
        return json.loads(out)
    except ValueError:
        return None


def sweep_model(name: str, workdir: Path, steps: int, do_verify: bool,
                log) -> list[Row]:
    suffix, batch = MODELS[name]
    src = workdir / f"{name}{suffix}"
    rows: list[Row] = []
    if not src.exists():
        code, _out, err, sec = run([sys.executable, "-m", "benchmarks.model_sweep_models", name,
                                    str(src)])
        if code != 0:
            return [Row(name, "build", str(code), error=error_line(1, err), seconds=sec,
                        flags=["BUILD-FAILED"])]
    b = ["--batch-size", str(batch)]
    code, out, err, sec = run(graphmem() + ["inspect", str(src), "--json"] + b)
    row = Row(name, "inspect", str(code), seconds=sec, error=error_line(code, err))
    doc = _json(out) if code == 0 else None
    if doc:
        row.est_x = f"{doc['estimated_peak_bytes'] / 2**20:.1f}MiB"
        notes = doc.get("estimate_notes") or []
        if notes and not row.error:
            row.error = f"note: {notes[0]}"[:110]
    if "Traceback" in err:
        row.flags.append("TRACEBACK")
    rows.append(row)
    log(f"{name}: inspect exit {code} ({sec:.1f} s)")
    for variant, opts in VARIANTS.items():
        out_path = workdir / f"{name}_{variant}{suffix}"
        if out_path.exists():
            shutil.rmtree(out_path) if out_path.is_dir() else out_path.unlink()
        code, out, err, sec = run(graphmem() + ["rewrite", str(src), "-o", str(out_path),
                                                "--json"] + b + opts)
        row = Row(name, variant, str(code), seconds=sec, error=error_line(code, err))
        if "Traceback" in err:
            row.flags.append("TRACEBACK")
        doc = _json(out) if code in (0, 1) else None
        if doc:
            before = doc["before"]["estimated_peak_bytes"]
            after = doc["after"]["estimated_peak_bytes"]
            row.est_x = f"{after / before:.2f}" if before else "-"
            if doc.get("reverted"):
                row.est_x += "(rev)"
            if code == 1 and not row.error:
                row.error = "budget not met"
        rows.append(row)
        log(f"{name}/{variant}: rewrite exit {code} ({sec:.1f} s) {row.error}")
        if not do_verify or not out_path.exists():
            continue
        sames, ratios, codes = [], [], []
        for threads in (1, 2):
            code, out, err, sec = run(graphmem() + [
                "verify", str(src), str(out_path), "--exact", "--threads", str(threads),
                "--steps", str(steps), "--json"] + b)
            row.seconds += sec
            codes.append(str(code))
            vdoc = _json(out) if code in (0, 1) else None
            if vdoc is None:
                row.error = row.error or error_line(code or 1, err)
                if "Traceback" in err:
                    row.flags.append("TRACEBACK")
                sames.append("?")
                ratios.append(None)
                continue
            sames.append("yes" if vdoc["same_training"] else "NO")
            o = vdoc["original"]["measured_peak_bytes"]
            r = vdoc["rewritten"]["measured_peak_bytes"]
            ratios.append(r / o if o else None)
            if not vdoc["same_training"]:
                row.flags.append("DIFFERS")
                row.error = row.error or (
                    f"loss diff {vdoc['max_loss_diff']:.2g}, var diff "
                    f"{vdoc['max_variable_diff']:.2g} ({vdoc['worst_variable']})")
        # and once as training runs, Grappler on: TF merges ops then, and a merge can undo
        # an order the rewrite relies on (passes/fusion_guard.py); within verify's
        # tolerances widened to float rounding's (Grappler may fuse the two graphs
        # differently); a skipped update differs by far more
        code, out, err, sec = run(graphmem() + [
            "verify", str(src), str(out_path), "--steps", str(steps), "--rtol", str(ROUNDING),
            "--atol", str(ROUNDING), "--json"] + b)
        row.seconds += sec
        codes.append(str(code))
        vdoc = _json(out) if code in (0, 1) else None
        sames.append("?" if vdoc is None else "yes" if vdoc["same_training"] else "NO")
        if vdoc is not None and not vdoc["same_training"]:
            row.flags.append("DIFFERS WITH GRAPPLER")
            row.error = row.error or f"Grappler on: {'; '.join(vdoc['mismatches'][:2])}"
        row.exit += "/" + ",".join(codes)
        row.same = "|".join(sames)
        row.meas_x = "|".join("-" if x is None else f"{x:.2f}" for x in ratios)
        if all(x is not None and x > GROWTH for x in ratios):
            row.flags.append("GROWS")
        log(f"{name}/{variant}: verify {row.same} {row.meas_x}")
    return rows


def sweep_synthetic(workdir: Path, log) -> list[Row]:
    from benchmarks.scale_bench import write_meta

    rows = []
    for shape, op_list in (("chain", True), ("residual", False), ("branchy", True)):
        path = workdir / f"synthetic_{shape}.meta"
        facts = write_meta(shape, 100_000, path, op_list)
        label = f"syn_{shape}_{facts['nodes'] // 1000}k" + ("" if op_list else "_noop")
        for variant, argv in (
                ("inspect", ["inspect", str(path)]),
                ("memory", ["rewrite", str(path), "-o", str(workdir / "syn_out.meta")]),
                ("swap", ["rewrite", str(path), "--swap", "-o", str(workdir / "syn_out.meta")]),
                ("budget0.6", ["rewrite", str(path), "--policy", "budget", "--budget", "0.6",
                               "-o", str(workdir / "syn_out.meta")])):
            code, out, err, sec = run(graphmem() + argv + ["--batch-size", "32", "--json"])
            row = Row(label, variant, str(code), seconds=sec, error=error_line(code, err))
            doc = _json(out)
            if doc and variant != "inspect":
                before = doc["before"]["estimated_peak_bytes"]
                row.est_x = f"{doc['after']['estimated_peak_bytes'] / before:.2f}"
            if "Traceback" in err:
                row.flags.append("TRACEBACK")
            if code not in (0, 1):
                row.flags.append("FAILED")
            rows.append(row)
            log(f"{label}/{variant}: exit {code} ({sec:.1f} s)")
    return rows


def sweep_bad_inputs(workdir: Path, log) -> list[Row]:
    bad = workdir / "bad"
    bad.mkdir(exist_ok=True)
    good_meta = workdir / "tf1_devices.meta"
    if not good_meta.exists():
        run([sys.executable, "-m", "benchmarks.model_sweep_models", "tf1_devices",
             str(good_meta)])
    truncated = bad / "truncated.meta"
    data = good_meta.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    inference = bad / "inference.pb"
    two_tags = bad / "two_tags"
    if not inference.exists():
        run([sys.executable, "-m", "benchmarks.model_sweep_models", "tf1_inference_pb",
             str(inference)])
    if not two_tags.exists():
        run([sys.executable, "-m", "benchmarks.model_sweep_models", "tf1_two_tags",
             str(two_tags)])
    shutil.rmtree(bad / "missing", ignore_errors=True)  # a tree an earlier run left behind
    for stale in bad.glob("out*"):
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    empty = bad / "empty_dir"
    empty.mkdir(exist_ok=True)
    garbage = bad / "garbage.meta"
    garbage.write_bytes(os.urandom(4096))
    tf2 = workdir / "k_clip"
    out = bad / "out"
    cases = [
        ("truncated .meta (inspect)", ["inspect", str(truncated)], None),
        ("truncated .meta (rewrite)", ["rewrite", str(truncated), "-o", f"{out}1.meta"],
         f"{out}1.meta"),
        ("random bytes .meta", ["rewrite", str(garbage), "-o", f"{out}2.meta"], f"{out}2.meta"),
        ("inference .pb (rewrite)", ["rewrite", str(inference), "-o", f"{out}3.pb"],
         f"{out}3.pb"),
        ("inference .pb (verify)", ["verify", str(inference), str(inference)], None),
        ("empty directory", ["rewrite", str(empty), "-o", f"{out}4"], f"{out}4"),
        ("two tags, no --tag", ["rewrite", str(two_tags), "-o", f"{out}5"], f"{out}5"),
        ("missing file", ["inspect", str(bad / "nope.meta")], None),
        ("--budget abc", ["rewrite", str(good_meta), "--budget", "abc", "-o", f"{out}6.meta"],
         f"{out}6.meta"),
        ("--budget 0", ["rewrite", str(good_meta), "--budget", "0", "-o", f"{out}7.meta"],
         f"{out}7.meta"),
        ("-o into missing dir", ["rewrite", str(good_meta), "-o",
                                 str(bad / "missing" / "sub" / "o.meta")],
         str(bad / "missing" / "sub" / "o.meta")),
        ("--checkpoints nomatch", ["rewrite", str(good_meta), "--checkpoints", "zzz_nomatch",
                                   "-o", f"{out}8.meta"], f"{out}8.meta"),
        ("--batch-size 0", ["inspect", str(good_meta), "--batch-size", "0"], None),
        ("--tag wrong", ["inspect", str(two_tags), "--tag", "nope"], None),
    ]
    if tf2.exists():
        cases += [
            ("wrong --function", ["rewrite", str(tf2), "--function", "nope", "-o", f"{out}9"],
             f"{out}9"),
            ("verify rewritten missing", ["verify", str(tf2), str(bad / "nope")], None),
        ]
    rows = []
    for label, argv, output in cases:
        code, _out, err, sec = run(graphmem() + argv)
        lines = [x for x in err.splitlines() if x.strip()]
        row = Row("bad-input", label, str(code), seconds=sec,
                  error=lines[-1][:150] if lines else "(no message)")
        ok = (code == 2 and len(lines) == 1 and lines[0].startswith("graphmem: error:")
              and (output is None or not Path(output).exists()))
        if not ok:
            row.flags.append("BAD-ERROR")
            if len(lines) > 1:
                row.error = f"{len(lines)} stderr lines; last: {lines[-1][:110]}"
        if "Traceback" in err:
            row.flags.append("TRACEBACK")
        rows.append(row)
        log(f"bad input {label}: exit {code}")
    return rows


def print_table(rows: list[Row]) -> None:
    head = ("model", "variant", "exit", "same 1|2", "est x", "meas x 1|2", "sec", "flags",
            "error")
    table = [head] + [(r.model, r.variant, r.exit, r.same, r.est_x, r.meas_x,
                       f"{r.seconds:.0f}", ",".join(r.flags), r.error[:120]) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head) - 1)]
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths, strict=False)) + "  " + t[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--keep", type=Path, help="build and rewrite here, and keep the files "
                    "(models already there are reused)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--no-verify", action="store_true")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--no-bad-inputs", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    tmp = None
    if args.keep:
        workdir = args.keep
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="graphmem-sweep-")
        workdir = Path(tmp.name)
    rows: list[Row] = []
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for result in pool.map(lambda n: sweep_model(n, workdir, args.steps,
                                                         not args.no_verify, log), names):
                rows += result
        if not args.no_synthetic:
            rows += sweep_synthetic(workdir, log)
        if not args.no_bad_inputs:
            rows += sweep_bad_inputs(workdir, log)
    finally:
        if tmp is not None:
            tmp.cleanup()
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=1))
    flagged = [r for r in rows if r.flags]
    print(f"\n{len(rows)} rows, {len(flagged)} flagged")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
