#!/usr/bin/env python
"""Real networks at their canonical input sizes: graphmem's memory policy against the
original, Grappler's memory optimizer and OpenAI's `memory_saving_gradients`, measured side
by side in one run.

Usage::

    python benchmarks/networks_bench.py [--models resnet_v1_50,inception_v3,...]
        [--batch 32] [--threads 1,2] [--processes 3] [--steps 3] [--warmup 0]
        [--no-peer] [--no-verify] [--json FILE]

The networks come from tf-slim (`pip install tf-slim tf-keras`; not graphmem dependencies)
or, named `keras_<Application>`, from Keras applications (saved as TF2 train-step
SavedModels by benchmarks/keras_models_bench.py, SGD with momentum, at 224 or 299 px);
`keras_transformer_lm` is the base transformer (6 layers, width 512, 8 heads, vocabulary
8192) as a causal language model at sequence length 256, Adam (run it with `--batch 16`);
`keras_lstm_lm` the large LSTM language model of Zaremba et al. (2 x 1500 units, vocabulary
10,000) at sequence length 35, Adam (its batch: `--batch 20`);
and
the slim ones are built as slim's own training scripts build them (benchmarks/slim_models_bench.py:
weight decay, batch norm with its moving averages in `UPDATE_OPS`, Momentum, auxiliary heads),
at the input size each network was designed for (224, or 299 for Inception v3). Variants:

- `original`: the graph as built;
- `grappler`: the original with Grappler's `RECOMPUTATION_HEURISTICS` memory optimizer on;
- `graphmem`: `graphmem rewrite MODEL --policy memory` (the default policy), run through the
  command line as a user runs it;
- `openai`: the same network with OpenAI's `memory_saving_gradients` (its memory policy) in
  place of `tf.gradients`, built by `../shared/peers/openai_peer.py` from git mirrors of its
  public repositories (`GM_MIRRORS`, default `/work/.mirror`); the column is left out, with
  the reason, when the peer cannot be made or raises on the network.

Every variant's step is measured in `--processes` fresh processes per thread setting, the
variants taking turns within each round (TF's executor order, and so the peak, changes from
process to process): the table shows the median step peak above resident memory relative to
the original's, the median step time likewise, and the peer's and graphmem's absolute peaks.
`--warmup 100` measures TF's steady state instead of its first steps; `--processes 0
--no-peer --no-verify` prints graphmem's estimate alone (nothing trained). With verification on,
`graphmem verify --exact` trains the original and graphmem's rewrite for 3 steps with
Grappler off at each thread setting, and `graphmem verify` once with Grappler on: "same"
means bit-identical losses and variables, and equal within float rounding (1e-4) with
Grappler on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
PEERS = ROOT.parent / "shared" / "peers"
MIB = 2 ** 20

from benchmarks.slim_models_bench import _graphmem  # noqa: E402 (after the path setup)
from graphmem.api import ROUNDING  # noqa: E402 (above it, a difference is not rounding)

# name -> canonical input side
SIDES = {"resnet_v1_50": 224, "resnet_v2_50": 224, "resnet_v1_101": 224,
         "inception_v1": 224, "inception_v2": 224, "inception_v3": 299,
         "vgg_16": 224, "vgg_19": 224, "alexnet_v2": 224, "overfeat": 231, "unet": 256,
         "keras_ResNet50": 224, "keras_MobileNetV2": 224, "keras_InceptionV3": 299,
         "keras_DenseNet121": 224, "keras_EfficientNetB0": 224, "keras_Xception": 299,
         "keras_VGG16": 224, "keras_MobileNetV3Small": 224, "keras_ResNet50V2": 224,
         "keras_ResNet101": 224, "keras_InceptionResNetV2": 299, "keras_DenseNet169": 224,
         "keras_MobileNet": 224, "keras_MobileNetV3Large": 224, "keras_NASNetMobile": 224,
         "keras_VGG19": 224, "keras_EfficientNetV2B0": 224, "keras_ConvNeXtTiny": 224,
         "keras_transformer_lm": 256, "keras_lstm_lm": 35}  # an LM's: its sequence
KERAS = "keras_"  # Keras applications, saved as TF2 train-step SavedModels
DEFAULT_MODELS = "resnet_v1_50,resnet_v2_50,inception_v1,inception_v3,vgg_16,alexnet_v2"


def _build(name: str, side: int, path: Path, peer: bool) -> str | None:
    """Build `name` into `path` in a child process (TF1 graph mode, a fresh graph; a Keras
    application as a TF2 train step); with `peer`, OpenAI's gradients instead of
    tf.gradients. None, or why it failed."""
    if name.startswith(KERAS):
        if peer:  # its gradients are tf.gradients of a TF1 graph; a tape has none to swap
            return "the peer rewrites tf.gradients in TF1 graphs, not a TF2 GradientTape"
        code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from benchmarks.keras_models_bench import build
build({name[len(KERAS):]!r}, Path({str(path)!r}), size={side!r})
"""
        return _run_build(code)
    code = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from pathlib import Path
from benchmarks.slim_models_bench import build
from benchmarks.networks_bench import build_unet
peer = None
if {peer!r}:
    sys.path.insert(0, {str(PEERS)!r})
    import openai_peer
    openai_peer.module()
    peer = lambda loss, opt: openai_peer.minimize(loss, opt, policy="memory")
(build_unet if {name!r} == "unet" else lambda p, s, minimize: build({name!r}, p, s,
                                                                    minimize=minimize))(
    Path({str(path)!r}), {side!r}, minimize=peer)
"""
    return _run_build(code)


def _run_build(code: str) -> str | None:
    env = {**os.environ, "GM_MIRRORS": os.environ.get("GM_MIRRORS", "/work/.mirror"),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit {proc.returncode}"
    return None


def build_unet(path: Path, side: int, minimize=None, levels=(64, 128, 256, 512),
               classes: int = 2) -> None:
    """A U-Net (Ronneberger et al. 2015) as TF1 segmentation training graph: two 3x3
    convolutions with batch norm and ReLU per level, max pooling down, transposed
    convolutions up, long skips joined by concatenation, a 1x1 head, per-pixel softmax
    cross-entropy, L2 weight decay and Momentum; `minimize(loss, opt)` as in
    slim_models_bench.build."""
    import tensorflow as tf

    from benchmarks.slim_models_bench import _legacy_layers_shim

    _legacy_layers_shim()
    import tf_slim as slim

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    v1.disable_control_flow_v2()
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(1)
        x = v1.placeholder(tf.float32, [None, side, side, 3], name="x")
        y = v1.placeholder(tf.int32, [None, side, side], name="y")
        count = [0]

        def conv(h, c, k=3):
            count[0] += 1
            w = v1.get_variable(f"conv{count[0]}", [k, k, h.shape[-1], c], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=count[0]))
            v1.add_to_collection(v1.GraphKeys.REGULARIZATION_LOSSES, 1e-4 * tf.nn.l2_loss(w))
            h = tf.nn.conv2d(h, w, 1, "SAME")
            h = slim.batch_norm(h, is_training=True, fused=True, scale=True)
            return tf.nn.relu(h)

        skips, h = [], x
        for c in levels:
            h = conv(conv(h, c), c)
            skips.append(h)
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        h = conv(conv(h, 2 * levels[-1]), 2 * levels[-1])
        for n, c in enumerate(reversed(levels)):
            w = v1.get_variable(f"up{n}", [2, 2, c, h.shape[-1]], use_resource=True,
                                initializer=v1.glorot_uniform_initializer(seed=100 + n))
            size = int(h.shape[1]) * 2
            shape = tf.stack([tf.shape(h)[0], size, size, c])
            h = tf.reshape(tf.nn.conv2d_transpose(h, w, shape, 2, "SAME"), [-1, size, size, c])
            h = tf.concat([h, skips[-1 - n]], -1)
            h = conv(conv(h, c), c)
        w = v1.get_variable("head", [1, 1, levels[0], classes], use_resource=True,
                            initializer=v1.glorot_uniform_initializer(seed=999))
        logits = tf.nn.conv2d(h, w, 1, "SAME")
        v1.losses.sparse_softmax_cross_entropy(y, logits)
        loss = v1.losses.get_total_loss()
        opt = v1.train.MomentumOptimizer(0.01, 0.9)
        with tf.control_dependencies(v1.get_collection(v1.GraphKeys.UPDATE_OPS)):
            train_op = minimize(loss, opt) if minimize else opt.minimize(loss, name="train_op")
        v1.add_to_collection("train_op", train_op)
        v1.variables_initializer(v1.global_variables(), name="init")
        saver = v1.train.Saver()
        v1.train.export_meta_graph(filename=str(path),
                                   graph_def=graph.as_graph_def(add_shapes=True),
                                   saver_def=saver.as_saver_def())


def _measure_once(path: Path, batch: int, threads: int, steps: int, warmup: int,
                  grappler_memory: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.measure", str(path), "--batch", str(batch),
           "--threads", str(threads), "--steps", str(steps + 1), "--warmup", str(warmup)]
    if grappler_memory:
        cmd += ["--grappler-memory", grappler_memory]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def _same_training(src: Path, out: Path, batch: int, threads: list[int]) -> str:
    """"same": bit-identical at each thread setting with Grappler off (`--exact`), and
    equal within verify's tolerances with Grappler on, as users train (TF merges ops
    then, and a merge can undo an order the rewrite relies on: passes/fusion_guard.py)."""
    for t in threads:
        _, doc, err = _graphmem("verify", str(src), str(out), "--exact", "--threads", str(t),
                                "--batch-size", str(batch), "--steps", "3", "--json")
        if doc is None:
            return f"error: {err}"
        if not doc["same_training"]:
            return f"NO ({t} threads)"
    code, _, err = _graphmem("verify", str(src), str(out), "--batch-size", str(batch),
                             "--steps", "3", "--rtol", str(ROUNDING), "--atol",
                             str(ROUNDING))
    return "same" if code == 0 else f"NO (Grappler on: {err})"


def run_model(name: str, args, tmp: Path) -> dict:
    side = SIDES[name]
    row: dict = {"model": name, "side": side, "batch": args.batch, "notes": []}
    suffix = "" if name.startswith(KERAS) else ".meta"  # a SavedModel is a directory
    src = tmp / f"{name}{suffix}"
    why = _build(name, side, src, peer=False)
    if why:
        row["notes"].append(f"build failed: {why}")
        return row
    variants: dict[str, tuple[Path, str | None]] = {"original": (src, None),
                                                    "grappler": (src, "RECOMPUTATION_HEURISTICS")}
    out = tmp / f"{name}_graphmem{suffix}"
    code, doc, err = _graphmem("rewrite", str(src), "-o", str(out), "--batch-size",
                               str(args.batch), "--json")
    if code != 0 or doc is None:
        row["notes"].append(f"graphmem rewrite exit {code}: {err}")
    else:
        variants["graphmem"] = (out, None)
        row["estimate"] = [doc["before"]["estimated_peak_bytes"],
                           doc["after"]["estimated_peak_bytes"]]
        row["reverted"] = doc["reverted"]
    if args.peer:
        peer = tmp / f"{name}_openai{suffix}"
        why = _build(name, side, peer, peer=True)
        if why:
            row["notes"].append(f"openai: {why}")
        else:
            variants["openai"] = (peer, None)
    measured: dict[str, dict[int, list[dict]]] = {v: {t: [] for t in args.threads}
                                                  for v in variants}
    for _round in range(args.processes):
        for t in args.threads:
            for v, (path, grappler) in variants.items():
                try:
                    measured[v][t].append(_measure_once(path, args.batch, t, args.steps,
                                                        args.warmup, grappler))
                except subprocess.CalledProcessError as e:
                    row["notes"].append(f"{v} @{t}: measure failed: "
                                        f"{(e.stderr or '').strip().splitlines()[-1:]}")
    row["measured"] = {
        v: {t: {"peak": statistics.median(r["peak"] for r in runs),
                "peaks": [r["peak"] for r in runs],
                "seconds": statistics.median(r["seconds"] for r in runs)}
            for t, runs in by_t.items() if runs}
        for v, by_t in measured.items()}
    if args.verify and "graphmem" in variants:
        row["training"] = _same_training(src, out, args.batch, args.threads)
    return row


def format_row(row: dict, threads: list[int]) -> list[str]:
    lines = []
    m = row.get("measured", {})
    base = m.get("original", {})
    for v in ("grappler", "openai", "graphmem"):
        if v not in m:
            continue
        cells = []
        for t in threads:
            b, r = base.get(t), m[v].get(t)
            if not b or not r:
                cells.append(f"{'-':>24}")
                continue
            cells.append(f"{r['peak'] / MIB:7.1f} MiB {r['peak'] / b['peak']:5.2f}x "
                         f"{r['seconds'] / b['seconds']:5.2f}t")
        extra = ""
        if v == "graphmem":
            est = row.get("estimate")
            extra = f"est. {est[1] / est[0]:.2f}x" if est else ""
            extra += f" {row.get('training', '')}"
        lines.append(f"| {row['model']} | {v} | " + " | ".join(cells) + f" | {extra} |")
    orig = " | ".join(f"{base[t]['peak'] / MIB:7.1f} MiB {base[t]['seconds']:.2f} s"
                      if t in base else "-" for t in threads)
    size = f"sequence {row['side']}" if row["model"].endswith("_lm") else f"{row['side']} px"
    lines.insert(0, f"| {row['model']} ({size}, batch {row['batch']}) | original | "
                 f"{orig} | |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--no-peer", dest="peer", action="store_false")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.threads = [int(t) for t in args.threads.split(",")]
    head = " | ".join(f"peak, x original, x step time @{t} thread(s)" for t in args.threads)
    print(f"| model | variant | {head} | notes |")
    print("|" + " --- |" * (3 + len(args.threads)))
    rows = []
    with tempfile.TemporaryDirectory(prefix="graphmem-networks-") as tmp:
        for name in args.models.split(","):
            row = run_model(name, args, Path(tmp))
            rows.append(row)
            for line in format_row(row, args.threads):
                print(line, flush=True)
            for note in row["notes"]:
                print(f"|  | note | {note} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
