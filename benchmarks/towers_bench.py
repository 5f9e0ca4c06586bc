"""Data-parallel training graphs: `python -m benchmarks.towers_bench`.

Builds multi-tower training graphs as users write them (TF1: one tower per device, the
gradients averaged on the parameter device, batch norm optional; TF2: a
`MirroredStrategy` train step), rewrites them with `--policy memory` and prints the
measured step peak of the whole process (the logical CPU devices share one allocator) of
original and rewritten graph, in fresh processes, at 1 and 2 inter-op threads.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path


def tf1_towers_graph(path: str | Path, towers: int = 2, layers: int = 16, width: int = 512,
                     features: int = 512, classes: int = 10, dropout: float = 0.1,
                     batch_norm: bool = False, seed: int = 0,
                     collective: bool = False) -> Path:
    """A TF1 multi-tower MLP saved as a .meta: variables on /cpu:0 (the parameter device),
    tower k's forward and backward pass on /cpu:k, its gradients averaged (`add_n` / n) on
    /cpu:0 and applied with Momentum. Batch norm (moving statistics updated by the first
    tower, as the classic recipe does) when `batch_norm`. With `collective`, each tower
    all-reduces its gradients with `CollectiveReduceV2` ops instead (as `tf.distribute`
    does) and the first tower's averages are applied (the graph is for rewriting, not for
    running: a session does not set up collective groups)."""
    import tensorflow as tf

    v1 = tf.compat.v1
    path = Path(path)
    graph = tf.Graph()
    with graph.as_default():
        v1.set_random_seed(seed)
        with tf.device("/cpu:0"):
            x = v1.placeholder(tf.float32, [None, features], name="x")
            y = v1.placeholder(tf.int32, [None], name="y")
            xs = tf.split(x, towers, name="split_x")
            ys = tf.split(y, towers, name="split_y")
            global_step = v1.train.get_or_create_global_step()
        opt = v1.train.MomentumOptimizer(0.01, 0.9)
        tower_grads, losses, update_ops = [], [], []
        for k in range(towers):
            with tf.device(f"/cpu:{k}"), v1.name_scope(f"tower_{k}"), \
                    v1.variable_scope("model", reuse=k > 0):
                h = xs[k]
                for i in range(layers):
                    with v1.variable_scope(f"layer_{i:02d}"):
                        with tf.device("/cpu:0"):
                            w = v1.get_variable("w", [h.shape[-1], width],
                                                initializer=v1.glorot_uniform_initializer())
                            b = v1.get_variable("b", [width], initializer=v1.zeros_initializer())
                        h = tf.nn.bias_add(tf.matmul(h, w), b)
                        if batch_norm:
                            h = _batch_norm(tf, h, width, update_ops if k == 0 else None)
                        h = tf.nn.relu(h)
                        if dropout:
                            h = tf.nn.dropout(h, rate=dropout, seed=seed + i)
                with tf.device("/cpu:0"):
                    wo = v1.get_variable("out_w", [width, classes],
                                         initializer=v1.glorot_uniform_initializer())
                logits = tf.matmul(h, wo)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=ys[k], logits=logits), name="loss")
                losses.append(loss)
                tower_grads.append(opt.compute_gradients(loss))
        with tf.device("/cpu:0"), v1.name_scope("average"):
            averaged = []
            for n, pairs in enumerate(zip(*tower_grads, strict=True)):
                v = pairs[0][1]
                if collective:
                    reduced = []
                    for k, (grad, _) in enumerate(pairs):
                        with tf.device(f"/cpu:{k}"):
                            reduced.append(tf.raw_ops.CollectiveReduceV2(
                                input=grad, group_size=towers, group_key=1,
                                instance_key=n + 1, ordering_token=[], merge_op="Add",
                                final_op="Div", name=f"all_reduce_{n}"))
                    update_ops.extend(reduced[1:])
                    g = reduced[0]
                else:
                    g = tf.add_n([p[0] for p in pairs]) / float(towers)
                averaged.append((g, v))
            total = tf.add_n(losses) / float(towers)
            total = tf.identity(total, name="total_loss")
            with tf.control_dependencies(update_ops):
                train_op = opt.apply_gradients(averaged, global_step=global_step,
                                               name="train")
        v1.add_to_collection("train_op", train_op)
        v1.add_to_collection("losses", total)
        v1.train.export_meta_graph(filename=str(path), graph=graph, clear_devices=False)
    return path


def _batch_norm(tf, h, width: int, update_ops: list | None):
    """Batch norm in training mode, its variables on the parameter device; the moving
    statistics updated from this tower's moments when `update_ops` collects the updates."""
    v1 = tf.compat.v1
    with tf.device("/cpu:0"):
        gamma = v1.get_variable("bn_gamma", [width], initializer=v1.ones_initializer())
        beta = v1.get_variable("bn_beta", [width], initializer=v1.zeros_initializer())
        mean_ma = v1.get_variable("bn_moving_mean", [width], trainable=False,
                                  initializer=v1.zeros_initializer())
        var_ma = v1.get_variable("bn_moving_variance", [width], trainable=False,
                                 initializer=v1.ones_initializer())
    mean, variance = tf.nn.moments(h, [0])
    if update_ops is not None:
        with tf.device("/cpu:0"):
            update_ops.append(v1.assign_sub(mean_ma, 0.01 * (mean_ma - mean)))
            update_ops.append(v1.assign_sub(var_ma, 0.01 * (var_ma - variance)))
    return tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3)


# the network: 16 layers of 512, batch 512 per tower, dropout, Momentum
CASES = {"mlp-2-towers": dict(towers=2), "mlp-4-towers-bn": dict(towers=4, layers=8,
                                                                 batch_norm=True)}
PER_TOWER_BATCH = 512


def run_case(name: str, workdir: Path, threads: list[int], processes: int,
             env: dict) -> list[dict]:
    """Build, rewrite (`--policy memory`, early updates) and measure one case: the peak of
    the whole process (every logical CPU device allocates from one allocator here)."""
    from benchmarks.measure import measure
    from graphmem.rewrite import RewriteOptions, rewrite_file

    params = CASES[name]
    batch = PER_TOWER_BATCH * params["towers"]
    src = tf1_towers_graph(workdir / f"{name}.meta", **params)
    out = workdir / f"{name}.memory.meta"
    result = rewrite_file(src, out, RewriteOptions("memory", [], batch))
    rows = []
    for n in threads:
        before = measure(str(src), batch, n, processes=processes, env=env)
        after = measure(str(out), batch, n, processes=processes, env=env)
        rows.append({
            "case": name, "threads": n, "processes": processes,
            "peak_before": before["peak"], "peak_after": after["peak"],
            "ratio": round(after["peak"] / before["peak"], 3),
            "peaks_after": after["peaks"],
            "seconds_before": round(before["seconds"], 4),
            "seconds_after": round(after["seconds"], 4),
            "estimated_by_device_before": result.before.peak_by_device,
            "estimated_by_device_after": result.after.peak_by_device,
        })
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--processes", type=int, default=3)
    ap.add_argument("--json", help="also write the rows to this file")
    a = ap.parse_args()
    env = dict(os.environ)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.cases.split(","):
            for row in run_case(name, Path(tmp), [int(t) for t in a.threads.split(",")],
                                a.processes, env):
                print(json.dumps(row), flush=True)
                rows.append(row)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
