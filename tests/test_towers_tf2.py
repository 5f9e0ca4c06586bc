"""A TF2 `MirroredStrategy` train step over 2 and 4 logical CPU devices, rewritten in
process with `graphmem.function` (memory policy; speed policy, which always copies ops):
both train exactly as the original step, each device's estimated peak drops (memory
policy: the towers' activations, 8 x 1 MiB each, are what recompute saves; with 32 rows
per tower there is nothing to save once the estimate follows Grappler's bypass of Keras'
IdentityN, and the rewrite is undone), the all-reduce (collective) ops are all kept and
none is copied.

Logical devices can only be set before TensorFlow starts, so each case runs in a fresh
interpreter and reports one JSON line.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.tf

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow as tf
import graphmem
from graphmem.analysis.towers import is_collective

towers, per = int(sys.argv[1]), 512
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * towers)
strategy = tf.distribute.MirroredStrategy([f"/cpu:{k}" for k in range(towers)])


def build():
    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tf.keras.Sequential(
            [tf.keras.Input((32,))]
            + [tf.keras.layers.Dense(512, activation="relu") for _ in range(8)]
            + [tf.keras.layers.Dense(10)])
        opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
        opt.build(model.trainable_variables)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                            reduction="none")

    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                              global_batch_size=per * towers)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def step(x, y):
        xs, ys = tf.split(x, towers), tf.split(y, towers)
        args = strategy.experimental_distribute_values_from_function(
            lambda ctx: (xs[ctx.replica_id_in_sync_group], ys[ctx.replica_id_in_sync_group]))
        return strategy.reduce(tf.distribute.ReduceOp.SUM,
                               strategy.run(replica, args=args), axis=None)
    return model, step


m1, original = build()
m2, step = build()
m3, step_speed = build()
spec = (tf.TensorSpec([per * towers, 32], tf.float32), tf.TensorSpec([per * towers], tf.int32))
rewritten = graphmem.function(step, *spec, policy="memory", batch_size=per * towers)
# kept even where its estimate is not lower: the copies are what is tested
speed = graphmem.function(step_speed, *spec, policy="speed", batch_size=per * towers,
                          keep_worse=True)
report = rewritten.report
rng = np.random.default_rng(0)
losses = []
for _ in range(3):
    x = rng.standard_normal((per * towers, 32)).astype(np.float32)
    y = rng.integers(0, 10, per * towers).astype(np.int32)
    losses.append((float(original(x, y)), float(rewritten(x, y)), float(speed(x, y))))
same = all(np.array_equal(a.numpy(), b.numpy()) and np.array_equal(a.numpy(), c.numpy())
           for a, b, c in zip(m1.variables, m2.variables, m3.variables, strict=True))


def collective_ops(fn):
    fdef = getattr(fn, "function_def", fn)
    return sorted(n.name for n in fdef.node_def if is_collective(n.op))


print(json.dumps({"losses": losses, "same_variables": same,
                  "variables": len(m1.variables),
                  "copied": speed.report.plan.copied_ops,
                  "before": report.before.peak_by_device,
                  "after": report.after.peak_by_device,
                  "collectives": [collective_ops(f) for f in (rewritten, speed)],
                  "original_collectives": collective_ops(
                      step.get_concrete_function(*spec).function_def)}))
'''


@pytest.mark.parametrize("towers", [2, 4])
def test_mirrored_strategy_step_trains_identically(towers):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(towers)], capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["copied"] > 0
    assert r["variables"] > 0 and r["same_variables"]
    assert all(a == b == c for a, b, c in r["losses"]), r["losses"]
    devices = [f"/device:CPU:{k}" for k in range(towers)]
    for d in devices:
        assert r["after"][d] < r["before"][d], (d, r["before"], r["after"])
    # the all-reduce ops are all there, none copied (the pipeline's order check passed)
    assert r["original_collectives"]
    assert [len(c) for c in r["collectives"]] == [len(r["original_collectives"])] * 2
