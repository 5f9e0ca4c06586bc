#!/usr/bin/env python
"""TF1 networks from a public model library (tf-slim): does every rewrite train the same, and
does the measured peak drop, at one and two inter-op threads?

Usage::

    python benchmarks/slim_models_bench.py [--models resnet_v1_50,inception_v3,...]
                                           [--variants memory,speed,swap] [--threads 1,2]

Needs `pip install tf-slim` (the networks come from `tf_slim.nets`; not a graphmem
dependency). Each network is built as a TF1 training graph the way slim's own training
scripts build one: `arg_scope` with weight decay and batch norm (moving averages in
`UPDATE_OPS`), softmax cross-entropy (plus the auxiliary head's, weighted 0.4, where the
network has one), the regularization losses, Momentum, and `slim.learning.create_train_op`
(which makes the train op wait for `UPDATE_OPS`). The graph is exported as a `.meta`, then
each variant runs through the command line as a user would run it:

- `graphmem rewrite MODEL -o OUT --policy P --batch-size B --json` (exit code, estimate),
- `graphmem verify MODEL OUT --exact --threads T --json` for each thread setting: training
  bit-identical (Grappler off) and the measured step peak of both graphs.

and each graph's step peak is measured with TensorFlow's defaults (Grappler on) in a fresh
process at each thread setting (`benchmarks/measure.py`), next to the original run with
Grappler's own `RECOMPUTATION_HEURISTICS` memory optimizer.

Printed: one row per model and variant: the rewrite's exit code, the estimated peak after /
before, the measured peak relative to the original's at each thread setting, and whether
training was bit-identical at every thread setting (`verify --exact`, Grappler off).
Expected duration on 2 cores: 3-5 minutes per model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (input side, batch): small inputs that each network's own layers accept
MODELS = {
    "resnet_v1_50": (128, 8),
    "resnet_v2_50": (128, 8),
    "inception_v3": (160, 2),
    "alexnet_v2": (224, 4),  # its fully connected head is a VALID conv: 224 only
    "vgg_16": (224, 2),  # likewise; 138M parameters (not in the default list)
}
CLASSES = 10


def _legacy_layers_shim() -> None:
    """tf-slim's batch norm goes through `tensorflow.python.layers`, which looks for
    `tf_keras.legacy_tf_layers`; tf-keras 2.21 keeps it under `tf_keras.src` (needs
    `pip install tf-keras`)."""
    import importlib

    try:
        importlib.import_module("tf_keras.legacy_tf_layers")
    except ImportError:
        sys.modules["tf_keras.legacy_tf_layers"] = importlib.import_module(
            "tf_keras.src.legacy_tf_layers")
        for sub in ("base", "core", "convolutional", "normalization", "pooling"):
            sys.modules[f"tf_keras.legacy_tf_layers.{sub}"] = importlib.import_module(
                f"tf_keras.src.legacy_tf_layers.{sub}")


def build(name: str, path: Path, side: int, minimize=None) -> None:
    """Write `name` as a TF1 training MetaGraphDef at `path`. `minimize(loss, opt)`, when
    given, makes the train op instead of slim's `create_train_op` (a peer's gradients),
    under the same wait for `UPDATE_OPS`."""
    import tensorflow as tf

    _legacy_layers_shim()
    import tf_slim as slim
    from tf_slim.nets import alexnet, inception, overfeat, resnet_v1, resnet_v2, vgg

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    v1.disable_control_flow_v2()
    nets = {
        "resnet_v1_50": (resnet_v1.resnet_v1_50, resnet_v1.resnet_arg_scope),
        "resnet_v2_50": (resnet_v2.resnet_v2_50, resnet_v2.resnet_arg_scope),
        "resnet_v1_101": (resnet_v1.resnet_v1_101, resnet_v1.resnet_arg_scope),
        "inception_v1": (inception.inception_v1, inception.inception_v1_arg_scope),
        "inception_v2": (inception.inception_v2, inception.inception_v2_arg_scope),
        "inception_v3": (inception.inception_v3, inception.inception_v3_arg_scope),
        "vgg_16": (vgg.vgg_16, vgg.vgg_arg_scope),
        "vgg_19": (vgg.vgg_19, vgg.vgg_arg_scope),
        "overfeat": (overfeat.overfeat, overfeat.overfeat_arg_scope),
        "alexnet_v2": (alexnet.alexnet_v2, alexnet.alexnet_v2_arg_scope),
    }
    net, arg_scope = nets[name]
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        x = v1.placeholder(tf.float32, [None, side, side, 3], name="x")
        y = v1.placeholder(tf.int32, [None], name="y")
        kwargs = {"num_classes": CLASSES, "is_training": True}
        if name.startswith("resnet"):
            kwargs["global_pool"] = True
        if name in ("vgg_16", "vgg_19", "alexnet_v2", "overfeat"):
            kwargs["dropout_keep_prob"] = 0.5  # dropout: random ops the rewrite must keep
        with slim.arg_scope(arg_scope()):
            logits, end_points = net(x, **kwargs)
        logits = tf.reshape(logits, [-1, CLASSES])
        v1.losses.sparse_softmax_cross_entropy(y, logits)
        if "AuxLogits" in end_points:
            aux = tf.reshape(end_points["AuxLogits"], [-1, CLASSES])
            v1.losses.sparse_softmax_cross_entropy(y, aux, weights=0.4)
        loss = v1.losses.get_total_loss()
        opt = v1.train.MomentumOptimizer(0.01, 0.9)
        if minimize is None:
            train_op = slim.learning.create_train_op(loss, opt)
        else:
            with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
                train_op = minimize(loss, opt)
        coll = v1.get_collection_ref("train_op")
        if train_op not in coll:
            coll.append(train_op)
        v1.variables_initializer(v1.global_variables(), name="init")
        saver = v1.train.Saver()
        v1.train.export_meta_graph(filename=str(path),
                                   graph_def=graph.as_graph_def(add_shapes=True),
                                   saver_def=saver.as_saver_def())


def _graphmem(*args: str) -> tuple[int, dict | None, str]:
    proc = subprocess.run([sys.executable, "-m", "graphmem.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    except json.JSONDecodeError:
        doc = None
    err = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return proc.returncode, doc, err


def _options(variant: str) -> list[str]:
    return ["--swap"] if variant == "swap" else ["--policy", variant]


def _measured(path: Path, batch: int, threads: list[int], steps: int,
              grappler_memory: str | None = None) -> list[int]:
    from benchmarks.measure import measure

    return [measure(str(path), batch, t, steps + 1, processes=1,
                    grappler_memory=grappler_memory)["peak"] for t in threads]


def _same_training(src: Path, out: Path, batch: int, threads: list[int], steps: int) -> str:
    for t in threads:
        _, doc, err = _graphmem("verify", str(src), str(out), "--exact", "--threads", str(t),
                                "--batch-size", str(batch), "--steps", str(steps), "--json")
        if doc is None:
            return f"error: {err}"
        if not doc["same_training"]:
            return f"NO ({t} threads)"
    return "yes"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(m for m in MODELS if m != "vgg_16"))
    ap.add_argument("--variants", default="memory,speed,swap")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    head = " | ".join(f"meas. x @{t}" for t in threads)
    print(f"{'model':<14} {'variant':<8} {'exit':>4} {'est. x':>7} | {head} | same training")
    failures = 0
    with tempfile.TemporaryDirectory(prefix="graphmem-slim-") as tmp:
        for name in args.models.split(","):
            side, batch = MODELS[name]
            src = Path(tmp) / f"{name}.meta"
            build(name, src, side)
            base = _measured(src, batch, threads, args.steps)
            cells = " | ".join(f"{b / 2**20:>8.1f} MiB" for b in base)
            print(f"{name:<14} {'original':<8} {'':>4} {'':>7} | {cells} |", flush=True)
            grappler = _measured(src, batch, threads, args.steps, "RECOMPUTATION_HEURISTICS")
            cells = " | ".join(f"{g / b:>11.2f}" for g, b in zip(grappler, base, strict=True))
            print(f"{name:<14} {'grappler':<8} {'':>4} {'':>7} | {cells} |", flush=True)
            for variant in args.variants.split(","):
                out = Path(tmp) / f"{name}_{variant}.meta"
                code, doc, err = _graphmem("rewrite", str(src), "-o", str(out),
                                           "--batch-size", str(batch), "--json",
                                           *_options(variant))
                if code != 0 or doc is None:
                    failures += 1
                    print(f"{name:<14} {variant:<8} {code:>4}  {err}", flush=True)
                    continue
                est = doc["after"]["estimated_peak_bytes"] / doc["before"]["estimated_peak_bytes"]
                peaks = _measured(out, batch, threads, args.steps)
                cells = " | ".join(f"{p / b:>11.2f}" for p, b in zip(peaks, base, strict=True))
                same = _same_training(src, out, batch, threads, args.steps)
                failures += same != "yes"
                note = " (reverted)" if doc.get("reverted") else ""
                print(f"{name:<14} {variant:<8} {code:>4} {est:>7.2f} | {cells} | {same}{note}",
                      flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
