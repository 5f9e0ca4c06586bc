"""The measured peak of a live train step against `graphmem.function`'s rewrite of it:
`python -m benchmarks.live_function_bench [--layers 24 --width 1024 --batch 128]`.

A Keras MLP (Dense + ReLU layers, Keras Adam) is trained by a `tf.function` train step in a
custom loop, as a TF2 user writes it; `graphmem.function` rewrites that step in process and
both are stepped alternately on the same variables and batches. Each step's peak is the CPU
allocator's peak above what was resident before it (docs: DESIGN "Measuring memory"), the
first steps of each left out; the median over `--processes` fresh processes is reported,
since the executor's order of independent ops, and with it the peak, changes from one
process to the next. Prints one JSON document; `ratio` is rewritten / original.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(layers: int, width: int, inputs: int, classes: int, seed: int = 0):
    """The model, its optimizer and a tf.function train step (imports TensorFlow)."""
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow("the benchmark builds a model")
    tf.keras.utils.set_random_seed(seed)
    stack = [tf.keras.Input(shape=(inputs,))]
    stack += [tf.keras.layers.Dense(width, activation="relu", name=f"dense_{i:02d}")
              for i in range(layers)]
    stack.append(tf.keras.layers.Dense(classes, name="logits"))
    model = tf.keras.Sequential(stack)
    opt = tf.keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y, logits=logits))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return tf, model, opt, train_step


def step_peak(tf, fn, x, y) -> tuple[int, float, float]:
    """One step's allocator peak above the resident bytes before it, its loss and time."""
    before = tf.config.experimental.get_memory_info("CPU:0")["current"]
    tf.config.experimental.reset_memory_stats("CPU:0")
    start = time.perf_counter()
    loss = float(fn(x, y).numpy())
    seconds = time.perf_counter() - start
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
    return max(peak - before, 0), loss, seconds


def run_here(args) -> dict:
    """One process: the original and the rewritten step, stepped alternately."""
    import numpy as np

    import graphmem
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow("the benchmark runs TensorFlow")
    try:  # as benchmarks/measure.py runs steps; only possible before TF's runtime starts
        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    except RuntimeError:
        pass
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": not args.grappler})
    tf, _model, _opt, train_step = build(args.layers, args.width, args.inputs, args.classes)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.standard_normal((args.batch, args.inputs)).astype(np.float32))
    y = tf.constant(rng.integers(0, args.classes, args.batch).astype(np.int32))
    start = time.perf_counter()
    step = graphmem.function(train_step, x, y, policy=args.policy)
    rewrite_seconds = time.perf_counter() - start
    original, rewritten = [], []
    for _ in range(args.steps):
        original.append(step_peak(tf, train_step, x, y))
        rewritten.append(step_peak(tf, step, x, y))
    skip = min(args.skip, args.steps - 1)
    report = step.report
    return {"original_peak": int(statistics.median(p for p, _, _ in original[skip:])),
            "rewritten_peak": int(statistics.median(p for p, _, _ in rewritten[skip:])),
            "original_seconds": statistics.median(s for _, _, s in original[skip:]),
            "rewritten_seconds": statistics.median(s for _, _, s in rewritten[skip:]),
            "estimated_before": report.before.peak_bytes,
            "estimated_after": report.after.peak_bytes,
            "checkpoints": len(report.checkpoints), "copied_ops": report.plan.copied_ops,
            "rewrite_seconds": rewrite_seconds}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--inputs", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--policy", default="memory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--no-grappler", dest="grappler", action="store_false",
                        help="run both steps with Grappler off")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_here(args)
        print(json.dumps(result))
        return result
    child_args = list(argv if argv is not None else sys.argv[1:])
    runs = []
    for _ in range(args.processes):
        out = subprocess.run([sys.executable, "-m", "benchmarks.live_function_bench",
                              *child_args, "--child"], cwd=ROOT, check=True,
                             capture_output=True, text=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    summary = {"model": f"Keras MLP {args.layers} x {args.width}, Adam, batch {args.batch}",
               "policy": args.policy, "grappler": args.grappler, "processes": args.processes,
               "original_peak": med["original_peak"], "rewritten_peak": med["rewritten_peak"],
               "ratio": round(med["rewritten_peak"] / max(med["original_peak"], 1), 3),
               "step_time_ratio": round(med["rewritten_seconds"] /
                                        max(med["original_seconds"], 1e-9), 3),
               "estimated_ratio": round(med["estimated_after"] /
                                        max(med["estimated_before"], 1), 3),
               "rewrite_seconds": round(med["rewrite_seconds"], 2), "runs": runs}
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
