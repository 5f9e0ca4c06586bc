"""A Keras application (MobileNetV2: depthwise convs, batch norm, ReLU6, residuals) saved as a
TF2 train step: the kind of model users bring from public model libraries."""

import os

import pytest

from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.applications.MobileNetV2(input_shape=(32, 32, 3), weights=None,
                                              classes=10, alpha=0.35)

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.model = model
            self.opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)

        @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32),
                                      tf.TensorSpec([None], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                loss = tf.reduce_mean(
                    tf.keras.losses.sparse_categorical_crossentropy(y, logits))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            return loss

    trainer = Trainer()
    trainer.train_step(tf.zeros([2, 32, 32, 3]), tf.zeros([2], tf.int32))
    path = tmp_path_factory.mktemp("keras") / "mobilenet"
    tf.saved_model.save(trainer, str(path))
    return path


@pytest.mark.parametrize("policy", ["memory", "speed"])
def test_keras_application_trains_identically(mobilenet, tmp_path, policy):
    out = tmp_path / "out"
    result = rewrite_file(mobilenet, out, RewriteOptions(policy, [], 32, keep_worse=True))
    assert result.model.function_name.startswith("__inference_train_step")
    assert result.plan.copied_ops > 0
    if policy == "memory":
        assert result.after.peak_bytes < 0.8 * result.before.peak_bytes
    r = verify(str(mobilenet), str(out), RunSpec(batch_size=8, grappler=False), 3, 0.0, 0.0)
    assert r.same_training, r.mismatches
