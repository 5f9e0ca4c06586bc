"""A TF2 train step that feeds its loss to a metric (as Keras's `train_step` does with its
loss tracker) and returns the metric: the loss is found (it is read by a variable update
only, not by a sink), and a rewrite trains bit for bit like the original."""

import pytest

from graphmem.formats import load_model
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

pytestmark = pytest.mark.tf

BATCH = 8
LAYERS = 8


@pytest.fixture(scope="module")
def tracked_step(tmp_path_factory):
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow("building the model")
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input(shape=(16,))]
        + [tf.keras.layers.Dense(32, activation="relu", name=f"dense_{i}") for i in range(LAYERS)]
        + [tf.keras.layers.Dense(4, name="logits")])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
    spec = [tf.TensorSpec([None, 16], tf.float32), tf.TensorSpec([None], tf.int32)]

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__(name="trainer")
            self.model, self.opt = model, opt
            self.total = tf.Variable(0.0, trainable=False, name="loss_total")
            self.count = tf.Variable(0.0, trainable=False, name="loss_count")

        @tf.function(input_signature=spec)
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=logits), name="batch_loss")
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            batch = tf.cast(tf.shape(x)[0], tf.float32)
            self.total.assign_add(loss * batch)
            self.count.assign_add(batch)
            return tf.math.divide_no_nan(self.total.read_value(), self.count.read_value())

    path = tmp_path_factory.mktemp("tracked") / "original"
    tf.saved_model.save(Trainer(), str(path))
    return path


def test_loss_read_by_a_metric_update_is_found(tracked_step):
    from graphmem.analysis.regions import analyze_regions
    from graphmem.graph.workspace import Workspace

    ws = Workspace.open(load_model(tracked_step), batch_size=BATCH)
    regions = analyze_regions(ws.index, batch_size=BATCH)
    assert [ws.index.names[t[0]] for t in regions.loss] == ["batch_loss"]
    # the metric's update is a state update, not part of the forward pass
    writes = {ws.index.names[i] for i in regions.state_updates}
    assert any("AssignAddVariableOp" in n for n in writes), writes


def test_rewrite_trains_identically(tracked_step, tmp_path):
    out = tmp_path / "memory"
    result = rewrite_file(tracked_step, out, RewriteOptions("memory", [], BATCH))
    assert result.plan.copied_ops > 0
    r = verify(str(tracked_step), str(out), RunSpec(batch_size=BATCH, grappler=False), 3,
               0.0, 0.0)
    assert r.same_training, r.mismatches
    assert r.max_loss_diff == 0 and r.max_variable_diff == 0
