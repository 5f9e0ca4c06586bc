#!/usr/bin/env python
"""The budget policy (`--policy budget --budget SIZE`) against the targets of issue 7:
estimated and measured peaks per budget, extra compute against the memory policy, solve time.

Usage::

    python benchmarks/budget_bench.py [--quick] [--models mlp,resnet,transformer]
                                      [--budgets 5] [--processes 2] [--threads 1]
                                      [--json FILE] [--keep DIR]

Expected duration on 2 cores: ~4-5 minutes with `--quick` (one measuring process per model
and per variant), ~7 without (two). Only one TensorFlow process runs at a time.

What it does:

1. Solve time, before TensorFlow is imported: a ~10k-node synthetic training graph
   (benchmarks/synthetic.py `chain_training_graph`: plain, `residual=True`, `branches=4`)
   is rewritten with the budget policy at a budget halfway between the smallest reachable
   peak and the original; the budget solve alone (units + solver, as `choose_budget_checkpoints`
   runs it) and the whole `rewrite_file` are timed, and the method (MILP, DP, greedy) named.
2. The benchmark models of recompute_bench.py (MLP, ResNet with batch norm, transformer; at
   its `--quick` sizes in both modes, so that a run stays short) are built; `graphmem plan`'s
   curve (`graphmem.plan.tradeoff`) gives the smallest reachable peak; budgets are spread
   from it to the original estimated peak, and each is a `--policy budget` rewrite. The
   `memory` policy is rewritten too, and the budget policy once more with the memory policy's
   estimated peak as the budget; extra compute is counted the same way for both (FLOPs of
   the copied ops over the forward FLOPs of the spine, as `graphmem plan` does).
3. Every variant's peak is measured alone, as a training run has it: in fresh processes
   of its own (benchmarks/measure.py, one graph per process), TensorFlow's allocator peak
   (`TF_CPU_ALLOCATOR_USE_BFC`). Training is compared in other worker processes (this
   script re-invoked with `--worker`): all variants of a model stepped in turn on the same
   feeds from the original's initial variables, losses and final variables compared with
   the original's in the same process; one more process per model repeats that with
   Grappler's remapper and arithmetic optimizer off, where a correct rewrite trains bit for
   bit like the original. The peaks of those shared processes are kept in the JSON output
   (`shared_process_peaks_bytes`) but not used: TF's CPU allocator is one per process, and
   the chunks seven graphs leave free shape where the next one's buffers land (in one full
   run the transformer's +1% plan measured 12.3-13.1 MB alone and 13.9-14.9 MB in the
   shared processes; `graphmem verify`, which steps the original in the same process,
   read up to 13.9 MB).

Targets (a PASS/FAIL line each):
- estimate: every budget plan's estimated peak <= its budget (for budgets >= the smallest
  reachable peak of the curve, which is a model figure and may be below what the estimate
  reaches: such budgets are reported, and count as met only when the rewrite says feasible);
- measured: measured peak / budget <= 1.10 for every budget (the ratio is printed);
- same training: every rewrite is bit-identical to the original with Grappler's remapper and
  arithmetic optimizer off (the exact run), and within verify's default tolerance (1e-5)
  with them on (they fuse a rewritten graph differently: float rounding, ~1e-7 in the loss,
  which Adam can grow to ~1e-5 in variables whose true gradient is about zero);
- compute: at the memory policy's estimated peak, budget extra compute <= memory policy's,
  and lower on the ResNet and the transformer;
- solve time: budget solve < 30 s on each 10k-node synthetic graph.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BASE_ENV = dict(os.environ)
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

from benchmarks import recompute_bench as rb  # noqa: E402

MIB = 1024 * 1024
MEASURED_SLACK = 1.10  # measured peak within 10% of the budget
SOLVE_SECONDS = 30.0
LOWER_COMPUTE_MODELS = ("resnet", "transformer")
# with Grappler's fusions on, the largest difference accepted (verify's default rtol)
FUSED_TOLERANCE = 1e-5
SYNTHETIC_SHAPES = ("chain", "residual", "branchy")
DEFAULT_STEPS = 5


# ----------------------------------------------------------------------------------------
# 1. solve time on synthetic graphs (no TensorFlow)
# ----------------------------------------------------------------------------------------
def synthetic_solve(shape: str, nodes: int, workdir: Path) -> dict[str, Any]:
    from benchmarks.scale_bench import write_meta
    from graphmem.analysis.activations import analyze_forward
    from graphmem.analysis.regions import analyze_regions
    from graphmem.analysis.spine import analyze_spine
    from graphmem.estimate import estimate_step
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.passes.budget import (
        build_units,
        choose_budget_checkpoints,
        model_base,
        solve_budget,
    )
    from graphmem.passes.checkpoints import candidate_tensors
    from graphmem.rewrite import RewriteOptions, rewrite_file

    batch = 32
    path = workdir / f"synthetic_{shape}.meta"
    facts = write_meta(shape, nodes, path, op_list=True)
    ws = Workspace.open(load_model(path), batch_size=batch)
    index = ws.index
    regions = analyze_regions(index, None, batch)
    forward = analyze_forward(index, regions)
    original = estimate_step(ws, regions, batch).peak_bytes
    candidates = candidate_tensors(index, regions, forward)
    spine = analyze_spine(index, regions, forward, set(candidates), batch)
    units = build_units(index, spine, batch)
    low = solve_budget(units, model_base(units, original), 0).min_peak
    budget = (low + original) // 2
    start = time.perf_counter()
    choice, sol = choose_budget_checkpoints(index, regions, forward, candidates, batch,
                                            budget, original)
    solve_seconds = time.perf_counter() - start
    start = time.perf_counter()
    result = rewrite_file(path, workdir / f"synthetic_{shape}_budget.meta",
                          RewriteOptions("budget", [], batch, budget=str(budget)))
    rewrite_seconds = time.perf_counter() - start
    return {"shape": shape, "nodes": facts["nodes"], "units": len(units.act),
            "budget_bytes": budget, "original_bytes": original,
            "solve_seconds": solve_seconds, "method": sol.method if sol else None,
            "model_feasible": bool(sol and sol.feasible),
            "rewrite_seconds": rewrite_seconds,
            "rewrite_method": result.budget.method if result.budget else None,
            "estimated_after_bytes": result.after.peak_bytes,
            "rewrite_feasible": bool(result.budget and result.budget.feasible),
            "note": result.choice.note,
            "tensorflow_imported": "tensorflow" in sys.modules}


# ----------------------------------------------------------------------------------------
# 2. plans on the benchmark models
# ----------------------------------------------------------------------------------------
def extra_flops_share(path: str, batch: int, forward_flops: int) -> float:
    """FLOPs of the recompute copies in a rewritten graph over the spine's forward FLOPs."""
    from graphmem.analysis.cost import op_flops
    from graphmem.formats import load_model
    from graphmem.graph.names import is_copy
    from graphmem.graph.workspace import Workspace

    index = Workspace.open(load_model(path), batch_size=batch).index
    extra = sum(op_flops(index, i, batch) for i in range(len(index))
                if is_copy(index.names[i]))
    return extra / max(forward_flops, 1)


def _rewrite(src: Path, name: str, batch: int, forward_flops: int, policy: str,
             budget: int | None = None) -> dict[str, Any]:
    from graphmem.rewrite import RewriteOptions, rewrite_file

    out = src.with_name(f"{name}.meta")
    start = time.perf_counter()
    result = rewrite_file(src, out, RewriteOptions(
        policy, [], batch, budget=None if budget is None else str(budget)))
    row = {"variant": name, "policy": policy, "path": str(out),
           "seconds": time.perf_counter() - start, "budget_bytes": budget,
           "estimated_before_bytes": result.before.peak_bytes,
           "estimated_after_bytes": result.after.peak_bytes,
           "reverted": result.reverted, "checkpoints": len(result.checkpoints),
           "copied_ops": result.plan.copied_ops, "note": result.choice.note,
           "extra_flops_share": extra_flops_share(str(out), batch, forward_flops)}
    if result.budget is not None:
        row.update(method=result.budget.method, feasible=result.budget.feasible,
                   model_peak_bytes=result.budget.model_peak,
                   model_extra_flops_share=result.budget.extra_flops
                   / max(result.budget.total_flops, 1))
    return row


def plan_model(model: dict, n_budgets: int) -> None:
    """Curve, budgets, rewrites; fills model['curve'], model['variants']."""
    from graphmem.plan import tradeoff

    src = Path(model["paths"]["original"])
    batch = model["batch"]
    curve = tradeoff(str(src), batch, steps=8)
    original = curve.original_peak_bytes
    low = min(p.peak_bytes for p in curve.points)
    model["curve"] = {"original_peak_bytes": original, "smallest_peak_bytes": low,
                      "forward_flops": curve.forward_flops,
                      "points": [vars(p) for p in curve.points],
                      "policies": [vars(p) for p in curve.policies]}
    variants = [{"variant": "original", "path": str(src), "estimated_after_bytes": original}]
    memory = _rewrite(src, "memory", batch, curve.forward_flops, "memory")
    variants.append(memory)
    for k in range(n_budgets):
        budget = int(low + (original - low) * k / max(n_budgets - 1, 1))
        variants.append(_rewrite(src, f"b{k}", batch, curve.forward_flops, "budget", budget))
    variants.append(_rewrite(src, "b@memory", batch, curve.forward_flops, "budget",
                             memory["estimated_after_bytes"]))
    model["variants"] = variants
    model["paths"] = {v["variant"]: v["path"] for v in variants}


# ----------------------------------------------------------------------------------------
# 3. worker: every variant of one model in one process
# ----------------------------------------------------------------------------------------
def run_worker(models_file: Path, name: str, threads: int, steps: int, exact: bool) -> dict:
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.runtime.train_runner import GraphRunner, RunSpec, make_feeds

    model = json.loads(models_file.read_text())[name]
    names = list(model["paths"])
    runs: dict[str, rb.VariantRun] = {}
    for variant in names:
        spec = RunSpec(train_op=model["train_op"], loss=model["loss"],
                       init_op=model["init_op"], batch_size=model["batch"],
                       inter_op_threads=threads)
        runner = GraphRunner(Workspace.open(load_model(model["paths"][variant])), spec)
        if exact:
            rb._reopen_exact(runner, threads, None)
        runs[variant] = rb.VariantRun(runner)
    ref = runs["original"]
    ref.runner.initialize()
    initial = ref.runner.variables()
    for variant in names[1:]:
        run = runs[variant]
        rb._guarded(run, lambda r=run: r.runner.load_variables(initial))
    feed_spec = RunSpec(batch_size=model["batch"])
    for step in range(steps):
        feeds = make_feeds(ref.runner.index, ref.runner.regions, feed_spec, step)
        shift = step % len(names)  # rotate the order: no variant always follows the same one
        for variant in names[shift:] + names[:shift]:
            run = runs[variant]
            record = rb._guarded(run, lambda r=run, f=feeds: r.runner.step(f))
            if record is not None:
                run.peaks.append(record.peak_bytes)
                run.seconds.append(record.seconds)
                run.losses.append(record.loss)
    ref_vars = ref.runner.variables()
    out = {}
    for variant, run in runs.items():
        variables = rb._guarded(run, run.runner.variables)
        row = {"peaks": run.peaks, "seconds": run.seconds, "losses": run.losses,
               "error": run.error}
        if variables is not None and ref.error is None:
            row.update(rb._compare(ref, run, ref_vars, variables))
        out[variant] = row
        run.runner.close()
    return out


def launch(models_file: Path, name: str, threads: int, steps: int, exact: bool) -> dict:
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(models_file),
           "--worker-model", name, "--worker-threads", str(threads), "--steps", str(steps)]
    if exact:
        cmd.append("--worker-exact")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=BASE_ENV,
                              timeout=rb.WORKER_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "worker timed out"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"worker exited {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def measure_alone(model: dict, threads: int, steps: int, processes: int) -> dict:
    """Each variant's peak in `processes` fresh processes of its own (benchmarks/measure.py):
    {variant: {"peak": median, "peaks": per process} or {"error": ...}}."""
    from benchmarks.measure import measure

    out = {}
    for variant, path in model["paths"].items():
        try:
            found = measure(path, model["batch"], threads, steps, processes, env=BASE_ENV)
            out[variant] = {"peak": found["peak"], "peaks": found["peaks"]}
        except Exception as exc:  # noqa: BLE001 - a failed variant is reported, not fatal
            out[variant] = {"error": f"measuring alone: {str(exc).splitlines()[0][:200]}"}
    return out


def summarize(model: dict, workers: list[dict], exact: dict, isolated: dict) -> None:
    """Per variant: median over its own processes of each one's median step peak (first
    step left out), same training in all shared processes, exact-run difference."""
    for v in model["variants"]:
        name = v["variant"]
        rows = [w[name] for w in workers if name in w]
        v["shared_process_peaks_bytes"] = [statistics.median(r["peaks"][1:] or r["peaks"])
                                           for r in rows if r["peaks"]]
        alone = isolated.get(name, {})
        v["process_peaks_bytes"] = alone.get("peaks", [])
        v["measured_peak_bytes"] = alone.get("peak")
        v["errors"] = sorted({r["error"] for r in rows if r.get("error")}
                             | {w["error"] for w in workers if w.get("error")}
                             | ({alone["error"]} if alone.get("error") else set()))
        diffs = [r["max_diff"] for r in rows if "max_diff" in r]
        v["max_diff"] = max(diffs) if diffs else None
        v["matched"] = bool(diffs) and len(diffs) == len(workers) and all(
            r.get("matched") for r in rows)
        ex = exact.get(name, {})
        v["exact_max_diff"] = ex.get("max_diff", ex.get("error", exact.get("error")))


# ----------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------
def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.2f}"


def _r(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def format_model(name: str, model: dict) -> list[str]:
    c = model["curve"]
    lines = [f"== {name}: {model['summary']}; {model['nodes']} nodes; estimated original "
             f"{_mib(c['original_peak_bytes'])} MiB, smallest reachable (plan curve) "
             f"{_mib(c['smallest_peak_bytes'])} MiB"]
    head = (f"{'variant':9} {'budget MiB':>10} {'est MiB':>8} {'est/bud':>7} {'meas MiB':>9} "
            f"{'meas/bud':>8} {'meas/est':>8} {'meas/orig':>9} {'extra FLOPs':>11} "
            f"{'matched':>15} {'exact':>9}  method")
    lines += [head, "-" * len(head)]
    orig_measured = model["variants"][0].get("measured_peak_bytes")
    for v in model["variants"]:
        b = v.get("budget_bytes")
        exact = v.get("exact_max_diff")
        exact_cell = ("-" if v["variant"] == "original" or exact is None else
                      "error" if isinstance(exact, str) else
                      "identical" if exact == 0 else f"{exact:.1e}")
        matched = ("reference" if v["variant"] == "original" else "error"
                   if v.get("max_diff") is None else
                   f"{'yes' if v['matched'] else 'NO'} ({v['max_diff']:.0e})")
        extra = v.get("extra_flops_share")
        method = v.get("method", "")
        if v.get("feasible") is False:
            method += " (infeasible)"
        if v.get("reverted"):
            method += " (reverted)"
        lines.append(
            f"{v['variant']:9} {_mib(b):>10} {_mib(v['estimated_after_bytes']):>8} "
            f"{_r(v['estimated_after_bytes'], b):>7} {_mib(v.get('measured_peak_bytes')):>9} "
            f"{_r(v.get('measured_peak_bytes'), b):>8} "
            f"{_r(v.get('measured_peak_bytes'), v['estimated_after_bytes']):>8} "
            f"{_r(v.get('measured_peak_bytes'), orig_measured):>9} "
            f"{'-' if extra is None else f'+{extra:.0%}':>11} {matched:>15} {exact_cell:>9}"
            f"  {method}")
        lines += [f"    {v['variant']} error: {e}" for e in v.get("errors", [])]
    return lines


def targets(models: dict, synthetic: list[dict]) -> list[tuple[str, bool, str]]:
    out = []
    est_bad, meas, meas_bad, train_bad, comp = [], [], [], [], []
    fused_diffs: list[float] = []
    comp_ok = True
    for name, m in models.items():
        low = m["curve"]["smallest_peak_bytes"]
        for v in m["variants"]:
            if v["variant"].startswith("b") and v["budget_bytes"] >= low:
                if v["estimated_after_bytes"] > v["budget_bytes"]:
                    est_bad.append(f"{name}/{v['variant']} "
                                   f"{v['estimated_after_bytes'] / v['budget_bytes']:.3f}")
            if v.get("budget_bytes") and v.get("measured_peak_bytes") is not None:
                ratio = v["measured_peak_bytes"] / v["budget_bytes"]
                meas.append(ratio)
                if ratio > MEASURED_SLACK:
                    meas_bad.append(f"{name}/{v['variant']} {ratio:.3f}")
            elif v.get("budget_bytes"):
                meas_bad.append(f"{name}/{v['variant']} not measured")
            if v["variant"] != "original":
                fused = v.get("max_diff")
                if v.get("exact_max_diff") != 0 or fused is None or fused > FUSED_TOLERANCE:
                    train_bad.append(f"{name}/{v['variant']}")
                elif fused:
                    fused_diffs.append(fused)
        by = {v["variant"]: v for v in m["variants"]}
        mem, bud = by["memory"]["extra_flops_share"], by["b@memory"]["extra_flops_share"]
        fits = by["b@memory"]["estimated_after_bytes"] <= by["memory"]["estimated_after_bytes"]
        ok = fits and bud <= mem + 1e-9 and (name not in LOWER_COMPUTE_MODELS or bud < mem)
        comp_ok &= ok
        comp.append(f"{name} budget +{bud:.1%} vs memory +{mem:.1%}"
                    f"{'' if fits else ' (budget plan above the memory peak)'}"
                    f"{'' if ok else ' FAIL'}")
    out.append(("estimated peak <= budget", not est_bad,
                "all budgets" if not est_bad else "over: " + ", ".join(est_bad)))
    spread = f"ratios {min(meas):.3f}..{max(meas):.3f}" if meas else "no ratios"
    out.append((f"measured peak <= {MEASURED_SLACK:.2f} x budget", not meas_bad and bool(meas),
                spread + ("" if not meas_bad else "; over: " + ", ".join(meas_bad))))
    fused_note = (f"; with them on, up to {max(fused_diffs):.0e} (Grappler fuses the "
                  "rewritten graph differently, as it does its own recompute)"
                  if fused_diffs else "; with them on too")
    out.append(("rewrites train identically", not train_bad,
                "bit for bit with Grappler's fusions off" + fused_note if not train_bad
                else "differ: " + ", ".join(train_bad)))
    out.append(("extra compute at the memory policy's peak", comp_ok, "; ".join(comp)))
    slow = [s for s in synthetic if s["solve_seconds"] >= SOLVE_SECONDS]
    out.append((f"budget solve < {SOLVE_SECONDS:.0f} s on 10k nodes", not slow and
                bool(synthetic), "; ".join(
                    f"{s['shape']} {s['nodes']} nodes: solve {s['solve_seconds']:.1f} s "
                    f"({s['method']}), whole rewrite {s['rewrite_seconds']:.1f} s"
                    for s in synthetic)))
    return out


def print_report(models: dict, synthetic: list[dict], settings: dict) -> list:
    print(f"graphmem budget benchmark ({settings['mode']}): measured = each variant alone, "
          f"median over {settings['processes']} process(es) of its own of each process's "
          f"median step peak (steps 2..{settings['steps']}), inter-op threads "
          f"{settings['threads']}, TF allocator; "
          "est = graphmem's estimate; extra FLOPs = copied ops / forward FLOPs of the spine; "
          "matched: losses and variables within 1e-6 of the original's in every process; "
          "exact: max diff with Grappler's remapper and arithmetic optimizer off.")
    for name, m in models.items():
        print()
        print("\n".join(format_model(name, m)))
    print()
    print("synthetic solve time (budget halfway between the smallest reachable and the "
          "original peak):")
    for s in synthetic:
        print(f"  {s['shape']:9} {s['nodes']} nodes, {s['units']} units: budget solve "
              f"{s['solve_seconds']:.2f} s ({s['method']}), whole rewrite "
              f"{s['rewrite_seconds']:.2f} s ({s['rewrite_method']}), estimated "
              f"{_mib(s['estimated_after_bytes'])} MiB for a budget of "
              f"{_mib(s['budget_bytes'])} MiB (original {_mib(s['original_bytes'])})")
    print()
    results = targets(models, synthetic)
    for what, ok, detail in results:
        print(f"{'PASS' if ok else 'FAIL'}  {what}: {detail}")
    return results


# ----------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="4 budgets, one measuring process per model (~5 min)")
    ap.add_argument("--models", default="mlp,resnet,transformer")
    ap.add_argument("--budgets", type=int, default=None,
                    help="budgets per model, smallest reachable to original (default 5; "
                         "quick 4)")
    ap.add_argument("--processes", type=int, default=None,
                    help="measuring processes per model (default 2; quick 1)")
    ap.add_argument("--threads", type=int, default=1, help="inter-op threads (default 1)")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument("--synthetic-nodes", type=int, default=10_000,
                    help="size of the synthetic graphs whose solve is timed (0: skip)")
    ap.add_argument("--json", type=Path, default=None, help="also write all numbers here")
    ap.add_argument("--keep", type=Path, default=None, help="build the models here")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--worker-exact", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def benchmark(args: argparse.Namespace, out: Path) -> dict:
    n_budgets = args.budgets or (4 if args.quick else 5)
    processes = args.processes or (1 if args.quick else 2)
    settings = {"mode": "quick" if args.quick else "full", "budgets": n_budgets,
                "processes": processes, "threads": args.threads, "steps": args.steps}
    synthetic = []
    for shape in SYNTHETIC_SHAPES if args.synthetic_nodes else ():  # before TF is imported
        log(f"synthetic {shape} ...")
        synthetic.append(synthetic_solve(shape, args.synthetic_nodes, out))
    specs = rb.model_specs(quick=True)  # the quick sizes in both modes: a run stays short
    names = args.models.split(",")
    log("building the models ...")
    models = rb.build_models([specs[n] for n in names], out)
    for name, model in models.items():
        log(f"planning and rewriting {name} ...")
        plan_model(model, n_budgets)
    models_file = out / "models.json"
    models_file.write_text(json.dumps(models, indent=1))
    for name, model in models.items():
        workers = []
        for p in range(processes):
            start = time.perf_counter()
            workers.append(launch(models_file, name, args.threads, args.steps, False))
            log(f"  {name} process {p + 1}: {time.perf_counter() - start:.0f} s, "
                f"{workers[-1].get('error') or 'ok'}")
        start = time.perf_counter()
        exact = launch(models_file, name, 1, min(args.steps, 3), True)
        log(f"  {name} exact run: {time.perf_counter() - start:.0f} s, "
            f"{exact.get('error') or 'ok'}")
        start = time.perf_counter()
        isolated = measure_alone(model, args.threads, args.steps, processes)
        log(f"  {name} peaks, each variant alone in {processes} process(es): "
            f"{time.perf_counter() - start:.0f} s")
        summarize(model, workers, exact, isolated)
        model["workers"] = workers
    results = print_report(models, synthetic, settings)
    return {"settings": settings, "synthetic": synthetic, "models": models,
            "targets": [{"target": w, "pass": ok, "detail": d} for w, ok, d in results]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        print(json.dumps(run_worker(args.worker, args.worker_model, args.worker_threads,
                                    args.steps, args.worker_exact)))
        return 0
    start = time.perf_counter()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        doc = benchmark(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="graphmem_budget_") as tmp:
            doc = benchmark(args, Path(tmp))
    doc["wall_seconds"] = time.perf_counter() - start
    print(f"\ntotal wall time {doc['wall_seconds']:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1, default=rb._jsonable))
    return 0 if all(t["pass"] for t in doc["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
