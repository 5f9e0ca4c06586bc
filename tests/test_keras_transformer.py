"""A Keras transformer (embedding, multi-head attention, dropout, layer norm, Adam) saved as a
TF2 train step: dropout draws from Keras seed-generator variables, which the rewrite must
neither recompute nor reorder."""

import os

import pytest

from graphmem.graph.names import is_copy
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

V, T, D = 200, 16, 32


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    inp = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(V, D)(inp)
    for _ in range(2):
        a = keras.layers.MultiHeadAttention(num_heads=2, key_dim=16, dropout=0.1)(h, h)
        h = keras.layers.LayerNormalization()(h + keras.layers.Dropout(0.1)(a))
        f = keras.layers.Dense(64, activation="gelu")(h)
        f = keras.layers.Dropout(0.1)(keras.layers.Dense(D)(f))
        h = keras.layers.LayerNormalization()(h + f)
    model = keras.Model(inp, keras.layers.Dense(V)(h))

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.opt = keras.optimizers.Adam(1e-3)
            # Keras 3 keeps dropout seeds in variables a tf.Module does not find itself
            self.seeds = [layer.seed_generator.state for layer in model._flatten_layers()
                          if getattr(layer, "seed_generator", None) is not None]

        @tf.function(input_signature=[tf.TensorSpec([None, T], tf.int32),
                                      tf.TensorSpec([None, T], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                out = self.model(x, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(y, out, from_logits=True))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            return loss

    trainer = Trainer()
    assert trainer.seeds, "the model should draw dropout masks from seed variables"
    trainer.train_step(tf.zeros([2, T], tf.int32), tf.zeros([2, T], tf.int32))
    path = tmp_path_factory.mktemp("keras") / "transformer"
    tf.saved_model.save(trainer, str(path))
    return path


@pytest.mark.parametrize("policy", ["memory", "speed"])
def test_keras_transformer_with_dropout_trains_identically(transformer, tmp_path, policy):
    out = tmp_path / "out"
    result = rewrite_file(transformer, out, RewriteOptions(policy, [], 16, keep_worse=True))
    assert result.plan.copied_ops > 0
    assert result.after.peak_bytes < result.before.peak_bytes
    # the seed reads and the random ops are stateful or read state: never copied
    copied = {n.op for n in result.model.function.node_def
              if is_copy(n.name)}
    assert not copied & {"ReadVariableOp", "AssignAddVariableOp", "AssignVariableOp"}
    r = verify(str(transformer), str(out), RunSpec(batch_size=16, grappler=False), 3, 0.0, 0.0)
    assert r.same_training, r.mismatches
