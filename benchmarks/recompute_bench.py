#!/usr/bin/env python
"""graphmem's recompute policies side by side with the original graph and with Grappler's
RECOMPUTATION_HEURISTICS memory optimizer: measured peak, step time, same training.

Usage::

    python benchmarks/recompute_bench.py [--quick] [--models mlp,resnet,transformer]
                                         [--processes 3] [--threads 1,2] [--json FILE]

The models (an MLP, a ResNet with batch norm, a transformer) are built with the fixture
builders of tests/fixtures/build_fixtures.py at benchmark sizes into a temporary directory,
then rewritten with `rewrite_file` (policies `none` (early updates only), `memory`, `speed`).

Why worker processes: TensorFlow's executor takes ready ops in an order that varies from one
process to the next, and the peak moves with it; and a process keeps the inter-op thread pool
of its first session, so one process cannot measure two thread settings. Each (model, threads)
measurement therefore runs in several fresh processes (this script re-invoked with `--worker`,
printing one JSON line), and the tables show medians across them. Inside a worker the five
variants start from the original's initial variables and are stepped in turn on the same
feeds, so their losses and final variables are compared with the original's of that process.
One more process per model repeats that comparison with the Grappler passes off whose
rewrites depend on how many readers a tensor has (remapper, arithmetic optimizer): there a
correct rewrite must train bit for bit like the original.

Also timed, in this process: graphmem's memory policy and rewrite on a ~100k-node synthetic
graph (benchmarks/synthetic.py, no TensorFlow), next to `python -c "import tensorflow"`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Workers and the `import tensorflow` timing get the environment the user started us with:
# the fixture builders set TF variables (oneDNN off) that would otherwise leak into them.
BASE_ENV = dict(os.environ)
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `benchmarks` and `tests` importable
    sys.path.insert(0, str(ROOT))

# `none` is graphmem's rewrite without recompute (its early-updates pass only): it tells how
# much of a policy's saving comes from recompute and how much from running updates early.
VARIANTS = ("original", "grappler", "none", "memory", "speed")
POLICIES = ("none", "memory", "speed")
GRAPPLER_MEMORY = "RECOMPUTATION_HEURISTICS"  # Grappler's memory optimizer, for `grappler`
MIB = 1024 * 1024
MATCH_TOLERANCE = 1e-6  # rtol and atol of "matched"
DEFAULT_STEPS = 6  # per worker; the peak is steady within a process, step times are not
WORKER_TIMEOUT = 1800  # seconds; a hung worker must not hang the whole run
TARGET_PEAK_RATIO = 0.5  # the targets for the memory policy
TARGET_TIME_RATIO = 1.4
PEAK_TARGET_MODELS = ("mlp", "resnet")


# ----------------------------------------------------------------------------------------
# models
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSpec:
    """A fixture builder and the sizes that replace its fixture's facts."""

    name: str
    builder: str  # function of tests/fixtures/build_fixtures.py
    base_facts: str  # its fixture's facts, which `sizes` override
    sizes: dict[str, Any]
    batch: int
    summary: str


def _resnet_plan(blocks_per_stage: int, channels: tuple[int, ...]) -> list[list]:
    """[out_channels, stride, projection] per block: stages of equal width, each later stage
    halving the resolution through a projection shortcut, like the fixture's plan."""
    plan = []
    for stage, c in enumerate(channels):
        for b in range(blocks_per_stage):
            first = b == 0 and stage > 0
            plan.append([c, 2 if first else 1, first])
    return plan


def _mlp(layers: int, width: int, batch: int) -> ModelSpec:
    sizes = {"layers": layers, "width": width, "in": width, "checkpoint_layers": []}
    return ModelSpec("mlp", "build_mlp", "MLP_FACTS", sizes, batch,
                     f"{layers} dense layers x {width}, Adam, batch {batch}")


def _resnet(image: int, per_stage: int, channels: tuple[int, ...], batch: int) -> ModelSpec:
    plan = _resnet_plan(per_stage, channels)
    sizes = {"image": [image, image, 3], "blocks": len(plan), "block_plan": plan}
    return ModelSpec("resnet", "build_resnet", "RESNET_FACTS", sizes, batch,
                     f"{len(plan)} residual blocks, channels {'/'.join(map(str, channels))}, "
                     f"fused batch norm, Momentum, {image}x{image}x3, batch {batch}")


def _transformer(seq: int, d_model: int, blocks: int, batch: int) -> ModelSpec:
    heads = 4
    sizes = {"seq_len": seq, "d_model": d_model, "heads": heads, "d_head": d_model // heads,
             "d_ff": 4 * d_model, "blocks": blocks, "vocab": 1000}
    return ModelSpec("transformer", "build_transformer", "TRANSFORMER_FACTS", sizes, batch,
                     f"{blocks} encoder blocks, seq {seq}, d_model {d_model}, {heads} heads, "
                     f"embedding, dropout, Adam, batch {batch}")


def model_specs(quick: bool, mlp: tuple[int, int, int] | None = None) -> dict[str, ModelSpec]:
    """Full sizes: one run takes ~9 minutes on 2 cores; quick ones ~4.
    `mlp` (layers, width, batch) replaces the MLP's sizes."""
    if quick:
        specs = [_mlp(*(mlp or (24, 512, 128))), _resnet(16, 4, (16, 32, 64), 32),
                 _transformer(64, 128, 2, 8)]
    else:
        specs = [_mlp(*(mlp or (32, 1024, 256))), _resnet(32, 4, (16, 32, 64), 32),
                 _transformer(64, 128, 4, 16)]
    return {s.name: s for s in specs}


def build_models(specs: Iterable[ModelSpec], out: Path) -> dict[str, dict]:
    """Export each model as a .meta (graph with shapes, `train_op` collection) under `out`.
    Imports TensorFlow: call it after anything timed in-process."""
    from tests.fixtures import build_fixtures as bf

    models = {}
    for spec in specs:
        folder = out / spec.name
        folder.mkdir(parents=True)
        facts = {**getattr(bf, spec.base_facts), **spec.sizes}
        entries = getattr(bf, spec.builder)(str(folder), facts)
        entry = next(e for e in entries if e["format"] == "meta")
        models[spec.name] = {
            "summary": spec.summary, "batch": spec.batch, "facts": facts,
            "nodes": entry["num_nodes"], "loss": entry["loss"], "train_op": entry["train_op"],
            "init_op": entry["init_op"], "paths": {"original": str(folder / entry["path"])},
            "rewrites": {},
        }
    return models


def rewrite_models(models: dict[str, dict]) -> None:
    """Write one rewritten .meta per policy next to each original; keep what the rewrite
    reports (estimates, checkpoints, copies) for the tables."""
    from graphmem.rewrite import RewriteOptions, rewrite_file

    for model in models.values():
        src = Path(model["paths"]["original"])
        for policy in POLICIES:
            out = src.with_name(f"{policy}.meta")
            start = time.perf_counter()
            result = rewrite_file(src, out, RewriteOptions(policy=policy,
                                                           batch_size=model["batch"]))
            model["paths"][policy] = str(out)
            model["rewrites"][policy] = {
                "seconds": time.perf_counter() - start,
                "estimated_before_bytes": result.before.peak_bytes,
                "estimated_after_bytes": result.after.peak_bytes,
                "checkpoints": len(result.checkpoints),
                "copied_ops": result.plan.copied_ops,
                "nodes_before": result.nodes_before,
                "nodes_after": result.nodes_after,
                "fallback": result.choice.fallback,
                "note": result.choice.note,
                "reverted": result.reverted,
                "early_update_edges": _early_edges(result),
            }


def _early_edges(result: Any) -> int | None:
    """Control edges the early-updates pass added (None when the driver has no such pass)."""
    early = getattr(result, "early", None)
    return None if early is None else early.edges


# ----------------------------------------------------------------------------------------
# worker: one process, one model, one thread setting, all variants
# ----------------------------------------------------------------------------------------
@dataclass
class VariantRun:
    """One variant's session in a worker and what its steps recorded."""

    runner: Any
    peaks: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    error: str | None = None


def _open_runners(model: dict, threads: int, exact: bool) -> dict[str, VariantRun]:
    """A GraphRunner per variant; `grappler` is the original graph in a session whose
    Grappler memory optimizer does RECOMPUTATION_HEURISTICS."""
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.runtime.train_runner import GraphRunner, RunSpec

    runs = {}
    for variant in VARIANTS:
        path = model["paths"]["original" if variant == "grappler" else variant]
        memory = GRAPPLER_MEMORY if variant == "grappler" else None
        spec = RunSpec(train_op=model["train_op"], loss=model["loss"],
                       init_op=model["init_op"], batch_size=model["batch"],
                       inter_op_threads=threads, grappler_memory_optimization=memory)
        runner = GraphRunner(Workspace.open(load_model(path)), spec)
        if exact:
            _reopen_exact(runner, threads, memory)
        runs[variant] = VariantRun(runner)
    return runs


def _reopen_exact(runner: Any, threads: int, memory: str | None) -> None:
    """Re-open the runner's session with Grappler's remapper *and* arithmetic optimizer off.
    Both rewrite an op only where its input has a single reader, which a recompute rewrite
    changes, so with either on a correct rewrite (graphmem's or Grappler's own) can round
    differently (~1e-7, which Adam turns into ~1e-6 on parameters whose true gradient is
    zero). RunSpec(grappler=False) turns all of Grappler off, its memory optimizer too,
    which would make the `grappler` variant the original; hence a session of our own."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    off = rewriter_config_pb2.RewriterConfig.OFF
    config = runner.tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                             inter_op_parallelism_threads=threads)
    options = config.graph_options.rewrite_options
    options.remapping = off
    options.arithmetic_optimization = off
    if memory:
        options.memory_optimization = getattr(rewriter_config_pb2.RewriterConfig, memory)
    runner.session.close()
    runner.session = runner.tf.compat.v1.Session(graph=runner.graph, config=config)


def _guarded(run: VariantRun, action: Callable[[], Any]) -> Any:
    """Run `action`; a failure (e.g. a Grappler error) ends this variant, not the worker."""
    if run.error is not None:
        return None
    try:
        return action()
    except Exception as exc:  # noqa: BLE001 - reported in the table, the others go on
        run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return None


def _step_all(runs: dict[str, VariantRun], feeds: dict, step: int) -> None:
    """Step every variant once on the same feeds; the order rotates so that no variant
    always runs right after the same other one (caches, allocator state)."""
    order = list(VARIANTS[step % len(VARIANTS):] + VARIANTS[:step % len(VARIANTS)])
    for variant in order:
        run = runs[variant]
        record = _guarded(run, lambda r=run: r.runner.step(feeds))
        if record is not None:
            run.peaks.append(record.peak_bytes)
            run.seconds.append(record.seconds)
            run.losses.append(record.loss)


def _max_diff(reference: Iterable[Any], values: Iterable[Any]) -> tuple[float, bool]:
    """Largest absolute difference, and whether all are within MATCH_TOLERANCE (relative
    to the reference's magnitude, absolute near zero)."""
    import numpy as np

    worst, matched = 0.0, True
    for a, b in zip(reference, values, strict=True):
        a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a64.size:
            worst = max(worst, float(np.max(np.abs(a64 - b64))))
        matched &= bool(np.allclose(b64, a64, rtol=MATCH_TOLERANCE, atol=MATCH_TOLERANCE))
    return worst, matched


def _compare(ref: VariantRun, run: VariantRun, ref_vars: dict, variables: dict) -> dict:
    loss_diff, matched = _max_diff(ref.losses, run.losses)
    var_diff, worst = 0.0, None
    for name in sorted(ref_vars):
        diff, ok = _max_diff([ref_vars[name]], [variables[name]])
        matched &= ok
        if diff > var_diff:
            var_diff, worst = diff, name
    return {"max_loss_diff": loss_diff, "max_variable_diff": var_diff, "worst_variable": worst,
            "max_diff": max(loss_diff, var_diff), "matched": matched}


def run_worker(models_file: Path, name: str, threads: int, steps: int, exact: bool) -> dict:
    """Train every variant of one model for `steps` steps; per variant: step peaks, step
    seconds, losses, and differences from the original."""
    from graphmem.runtime.train_runner import RunSpec, make_feeds

    model = json.loads(models_file.read_text())[name]
    runs = _open_runners(model, threads, exact)
    ref = runs["original"]
    ref.runner.initialize()
    initial = ref.runner.variables()
    for variant in VARIANTS[1:]:
        run = runs[variant]
        _guarded(run, lambda r=run: r.runner.load_variables(initial))
    feed_spec = RunSpec(batch_size=model["batch"])
    for step in range(steps):
        _step_all(runs, make_feeds(ref.runner.index, ref.runner.regions, feed_spec, step), step)
    ref_vars = ref.runner.variables()
    out = {}
    for variant, run in runs.items():
        variables = _guarded(run, run.runner.variables)
        result = {"peaks": run.peaks, "seconds": run.seconds, "losses": run.losses,
                  "error": run.error}
        if variables is not None and ref.error is None:
            result.update(_compare(ref, run, ref_vars, variables))
        out[variant] = result
        run.runner.close()
    return out


# ----------------------------------------------------------------------------------------
# driver: workers, medians
# ----------------------------------------------------------------------------------------
@dataclass
class Job:
    """One worker process. `exact` jobs run with Grappler's remapper and arithmetic
    optimizer off (see `_reopen_exact`): only then must a correct rewrite train bit for bit
    like the original. They check correctness, and are not measurements."""

    model: str
    threads: int
    process: int
    steps: int
    exact: bool = False


def launch_worker(models_file: Path, job: Job) -> dict:
    """Run one worker process; its last stdout line is its JSON result."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(models_file),
           "--worker-model", job.model, "--worker-threads", str(job.threads),
           "--steps", str(job.steps)]
    if job.exact:
        cmd.append("--worker-exact")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=BASE_ENV,
                              timeout=WORKER_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {WORKER_TIMEOUT} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"worker exited {proc.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def plan_jobs(names: list[str], threads: list[int], processes: int, steps: int) -> list[Job]:
    """Measurement jobs, repetitions as the outer loop so that a burst of machine noise
    spreads over all measurements instead of hitting one; then one exact job per model."""
    jobs = [Job(m, t, p, steps) for p in range(processes) for m in names for t in threads]
    return jobs + [Job(m, 1, 0, min(steps, 3), exact=True) for m in names]


def run_jobs(models_file: Path, jobs: list[Job]) -> tuple[dict, dict]:
    """Measurement results by model and thread setting, and exact results by model."""
    measured: dict[str, dict[int, list[dict]]] = {}
    exact: dict[str, dict] = {}
    for n, job in enumerate(jobs, 1):
        start = time.perf_counter()
        result = launch_worker(models_file, job)
        if job.exact:
            exact[job.model] = result
        else:
            measured.setdefault(job.model, {}).setdefault(job.threads, []).append(result)
        what = "exactness check" if job.exact else f"process {job.process + 1}"
        print(f"  [{n}/{len(jobs)}] {job.model} threads={job.threads} {what}: "
              f"{time.perf_counter() - start:.0f} s, {result.get('error') or 'ok'}",
              file=sys.stderr, flush=True)
    return measured, exact


def _median_skip_first(values: list[float]) -> float | None:
    """A process's figure: median over steps, the first (one-time allocations) left out."""
    kept = values[1:] or values
    return statistics.median(kept) if kept else None


def summarize(worker_results: list[dict], exact: dict | None) -> dict[str, dict]:
    """Per variant: medians across processes of each process's step median, worst
    difference from the original, matched only if matched in every process; and the
    difference in the exact run."""
    out = {}
    for variant in VARIANTS:
        per_process = [r[variant] for r in worker_results if variant in r]
        errors = sorted({r["error"] for r in worker_results if r.get("error")} |
                        {p["error"] for p in per_process if p.get("error")})
        peaks = [v for p in per_process if (v := _median_skip_first(p["peaks"])) is not None]
        times = [v for p in per_process if (v := _median_skip_first(p["seconds"])) is not None]
        diffs = [p["max_diff"] for p in per_process if "max_diff" in p]
        out[variant] = {
            "peak_bytes": statistics.median(peaks) if peaks else None,
            "step_seconds": statistics.median(times) if times else None,
            "process_peaks_bytes": peaks,
            "process_step_seconds": times,
            "max_diff": max(diffs) if diffs else None,
            "matched": bool(diffs) and all(p.get("matched") for p in per_process
                                          if "max_diff" in p) and len(diffs) == len(peaks),
            "processes": len(peaks),
            "errors": errors,
            "exact_max_diff": _exact_diff(exact, variant),
        }
    return out


def _exact_diff(exact: dict | None, variant: str) -> float | str | None:
    """The variant's difference from the original in the exact run, or its error."""
    if not exact:
        return None
    row = exact.get(variant)
    if row is None:
        return exact.get("error", "no result")
    return row.get("max_diff", row.get("error"))


# ----------------------------------------------------------------------------------------
# synthetic scaling: graphmem's own cost on a large graph, without TensorFlow
# ----------------------------------------------------------------------------------------
def synthetic_scaling(target_nodes: int) -> dict[str, Any]:
    """Wall time of each step of a memory-policy rewrite of a ~`target_nodes` chain."""
    from benchmarks.synthetic import chain_training_graph
    from graphmem.analysis.activations import analyze_forward
    from graphmem.analysis.regions import analyze_regions
    from graphmem.graph.index import GraphIndex
    from graphmem.graph.opdefs import OpRegistry
    from graphmem.passes.checkpoints import choose_checkpoints
    from graphmem.passes.recompute import apply_recompute

    graph = chain_training_graph(target_nodes // 8)  # 8 nodes per layer
    registry = OpRegistry(use_tensorflow=False)
    phases: dict[str, float] = {}

    def timed(phase: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        value = fn()
        phases[phase] = time.perf_counter() - start
        return value

    index = timed("GraphIndex.build", lambda: GraphIndex.build(graph, registry))
    regions = timed("analyze_regions", lambda: analyze_regions(index))
    facts = timed("analyze_forward", lambda: analyze_forward(index, regions))
    choice = timed("choose_checkpoints", lambda: choose_checkpoints(
        "memory", index, regions, facts, None))
    plan = timed("apply_recompute", lambda: apply_recompute(index, regions, facts,
                                                             choice.tensors))
    new_index = timed("re-index", lambda: GraphIndex.build(graph, registry))
    return {"nodes": len(index), "nodes_after": len(new_index),
            "checkpoints": len(choice.tensors), "copied_ops": plan.copied_ops,
            "phases_seconds": phases, "total_seconds": sum(phases.values())}


def import_tensorflow_seconds(runs: int) -> list[float]:
    """Wall time of `python -c "import tensorflow"`, for scale: what any TF tool pays first."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import tensorflow"], env=BASE_ENV,
                       capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return times


# ----------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------
def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _matched_cell(variant: str, row: dict) -> str:
    if variant == "original":
        return "reference"
    if row["max_diff"] is None:
        return "error"
    return f"{'yes' if row['matched'] else 'NO'} ({row['max_diff']:.1e})"


def _exact_cell(variant: str, row: dict) -> str:
    diff = row["exact_max_diff"]
    if variant == "original" or diff is None:
        return "-"
    if isinstance(diff, str):
        return "error"
    return "identical" if diff == 0 else f"{diff:.1e}"


def format_table(model: dict, rows: dict[str, dict]) -> list[str]:
    base = rows["original"]
    header = (f"{'variant':9} {'peak MiB':>9} {'x orig':>7} {'step ms':>8} {'x orig':>7}  "
              f"{'matched (max diff)':19} {'exact run':10} {'est. MiB before -> after':>25}")
    lines = [header, "-" * len(header)]
    for variant, row in rows.items():
        rewrite = model["rewrites"].get(variant)
        estimate = "-"
        if rewrite:
            estimate = (f"{rewrite['estimated_before_bytes'] / MIB:.1f} -> "
                        f"{rewrite['estimated_after_bytes'] / MIB:.1f}")
            estimate += " (reverted)" if rewrite["reverted"] else ""
        lines.append(
            f"{variant:9} {_fmt(row['peak_bytes'], '9.1f', MIB)} "
            f"{_fmt(_ratio(row['peak_bytes'], base['peak_bytes']), '7.2f')} "
            f"{_fmt(row['step_seconds'], '8.0f', 1e-3)} "
            f"{_fmt(_ratio(row['step_seconds'], base['step_seconds']), '7.2f')}  "
            f"{_matched_cell(variant, row):19} {_exact_cell(variant, row):10} {estimate:>25}")
        lines += [f"    {variant} error: {e}" for e in row["errors"]]
        if isinstance(row["exact_max_diff"], str):
            lines.append(f"    {variant} exact run error: {row['exact_max_diff']}")
    return lines


def format_rewrites(model: dict) -> str:
    parts = []
    for policy, r in model["rewrites"].items():
        extra = ", fallback: cuts" if r["fallback"] else ""
        if r["early_update_edges"] is not None:
            extra += f", {r['early_update_edges']} early-update edges"
        parts.append(f"{policy}: {r['checkpoints']} checkpoints, {r['copied_ops']} copied ops"
                     f"{extra}, {r['seconds']:.1f} s")
    return "rewrite " + "; ".join(parts)


def _verdict(values: list[float | None], ok: Callable[[float], bool]) -> str:
    """Three decimals: 0.503x must not print as a target of 0.5x "NOT met" at 0.50x."""
    shown = " | ".join(_fmt(v, ".3f") + "x" if v is not None else "-" for v in values)
    known = [v for v in values if v is not None]
    met = "met" if known and len(known) == len(values) and all(ok(v) for v in known) \
        else "NOT met"
    return f"{shown} ({met})"


def format_targets(name: str, by_threads: dict[int, dict]) -> str:
    """The memory policy against the issue's targets, one figure per thread setting."""
    rows = list(by_threads.values())
    peak = [_ratio(r["memory"]["peak_bytes"], r["original"]["peak_bytes"]) for r in rows]
    vs_grappler = [_ratio(r["memory"]["peak_bytes"], r["grappler"]["peak_bytes"]) for r in rows]
    step = [_ratio(r["memory"]["step_seconds"], r["original"]["step_seconds"]) for r in rows]
    parts = []
    if name in PEAK_TARGET_MODELS:
        parts.append(f"peak {_verdict(peak, lambda v: v <= TARGET_PEAK_RATIO)} "
                     f"[<= {TARGET_PEAK_RATIO}x orig]")
    else:
        parts.append(f"peak {' | '.join(_fmt(v, '.3f') + 'x' for v in peak)} [no target]")
    parts.append(f"vs Grappler {_verdict(vs_grappler, lambda v: v < 1.0)} [< 1x]")
    parts.append(f"step time {_verdict(step, lambda v: v <= TARGET_TIME_RATIO)} "
                 f"[<= {TARGET_TIME_RATIO}x]")
    return f"{name:12} " + "; ".join(parts)


def print_report(models: dict, summaries: dict, synthetic: dict, tf_import: list[float],
                 settings: dict) -> None:
    print(f"graphmem recompute benchmark ({settings['mode']} mode): median over "
          f"{settings['processes']} processes of each process's median over steps 2..."
          f"{settings['steps']}; TensorFlow's default session options.")
    print(f"matched: every loss and final variable within {MATCH_TOLERANCE:g} (rel. and abs.) "
          f"of the original's in the same process, worst of all processes; exact run: max "
          f"diff in one extra process with Grappler's remapper and arithmetic optimizer off "
          f"(then a correct rewrite trains bit-identically).")
    print(f"grappler: the original graph with Grappler's {GRAPPLER_MEMORY}; none, memory, "
          f"speed: graphmem rewrites with that --policy (none: early updates only).")
    for name, by_threads in summaries.items():
        model = models[name]
        for threads, rows in by_threads.items():
            print()
            print(f"== {name}: {model['summary']}; {model['nodes']} nodes; "
                  f"inter-op threads {threads}")
            print("\n".join(format_table(model, rows)))
        print(format_rewrites(model))
    print()
    threads = " | ".join(str(t) for t in settings["threads"])
    print(f"memory policy vs the issue's targets (inter-op threads {threads}):")
    for name, by_threads in summaries.items():
        print(format_targets(name, by_threads))
    print()
    phases = ", ".join(f"{k} {v:.2f}" for k, v in synthetic["phases_seconds"].items())
    print(f"synthetic scaling: memory policy + rewrite of a {synthetic['nodes']}-node chain "
          f"({synthetic['checkpoints']} checkpoints, {synthetic['copied_ops']} copies) in "
          f"{synthetic['total_seconds']:.2f} s ({phases})")
    print(f"for comparison, python -c 'import tensorflow': "
          f"{statistics.median(tf_import):.2f} s (median of {len(tf_import)})")


# ----------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller models (~4 min instead of ~9)")
    ap.add_argument("--models", default=None,
                    help="comma separated: mlp,resnet,transformer (default: all)")
    ap.add_argument("--processes", type=int, default=3,
                    help="worker processes per model and thread setting (default 3)")
    ap.add_argument("--threads", default="1,2", help="inter-op thread settings (default 1,2)")
    ap.add_argument("--steps", type=int, default=None,
                    help="training steps per worker (default 6); the first is not counted")
    ap.add_argument("--mlp", default=None, metavar="LAYERS,WIDTH,BATCH",
                    help="MLP sizes (default 32,1024,256; quick 24,512,128)")
    ap.add_argument("--synthetic-nodes", type=int, default=100_000,
                    help="size of the synthetic graph whose rewrite is timed")
    ap.add_argument("--json", type=Path, default=None, help="also write all numbers here")
    ap.add_argument("--keep", type=Path, default=None,
                    help="build the models here (kept) instead of a temporary directory")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-model", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--worker-exact", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def _selected_models(args: argparse.Namespace) -> list[ModelSpec]:
    mlp = tuple(int(v) for v in args.mlp.split(",")) if args.mlp else None
    if mlp is not None and len(mlp) != 3:
        raise SystemExit("--mlp wants LAYERS,WIDTH,BATCH")
    specs = model_specs(args.quick, mlp)
    names = args.models.split(",") if args.models else list(specs)
    unknown = [n for n in names if n not in specs]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(specs)}")
    return [specs[n] for n in names]


def benchmark(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Everything one run measures, as one JSON-ready document (also printed as tables)."""
    specs = _selected_models(args)
    threads = [int(t) for t in args.threads.split(",")]
    steps = args.steps or DEFAULT_STEPS
    settings = {"mode": "quick" if args.quick else "full", "processes": args.processes,
                "threads": threads, "steps": steps,
                "match_tolerance": MATCH_TOLERANCE}
    print("synthetic scaling check ...", file=sys.stderr, flush=True)
    synthetic = synthetic_scaling(args.synthetic_nodes)  # before TF is imported here
    tf_import = import_tensorflow_seconds(3)
    print("building and rewriting the models ...", file=sys.stderr, flush=True)
    models = build_models(specs, out_dir)
    rewrite_models(models)
    models_file = out_dir / "models.json"
    models_file.write_text(json.dumps(models, indent=1))
    jobs = plan_jobs([s.name for s in specs], threads, args.processes, steps)
    measured, exact = run_jobs(models_file, jobs)
    summaries = {m: {t: summarize(results, exact.get(m)) for t, results in by_t.items()}
                 for m, by_t in measured.items()}
    print_report(models, summaries, synthetic, tf_import, settings)
    return {"settings": settings, "models": models, "summaries": summaries,
            "workers": measured, "exact_workers": exact, "synthetic": synthetic,
            "import_tensorflow_seconds": tf_import}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker is not None:
        result = run_worker(args.worker, args.worker_model, args.worker_threads,
                            args.steps or DEFAULT_STEPS, args.worker_exact)
        print(json.dumps(result))
        return 0
    start = time.perf_counter()
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        document = benchmark(args, args.keep)
    else:
        with tempfile.TemporaryDirectory(prefix="graphmem_bench_") as tmp:
            document = benchmark(args, Path(tmp))
    document["wall_seconds"] = time.perf_counter() - start
    print(f"\ntotal wall time {document['wall_seconds']:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(document, indent=1, default=_jsonable))
    return 0


def _jsonable(value: Any) -> Any:
    """Dataclasses and numpy scalars in the document."""
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


if __name__ == "__main__":
    sys.exit(main())
