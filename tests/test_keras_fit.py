"""graphmem.keras.rewrite_train_step: Keras `fit` on a rewritten train step trains bit for
bit like plain `fit` (Grappler off), optimizer slots and batch-norm statistics included."""

import numpy as np
import pytest

import graphmem
import graphmem.keras

pytestmark = pytest.mark.tf


@pytest.fixture
def tf():
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow()
    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    yield tf
    tf.config.optimizer.set_experimental_options(
        {"disable_meta_optimizer": saved.get("disable_meta_optimizer", False)})


def _mlp(tf):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [tf.keras.Input((24,))]
        + [tf.keras.layers.Dense(48, activation="relu") for _ in range(8)]
        + [tf.keras.layers.Dense(6)])
    model.compile(tf.keras.optimizers.Adam(1e-3),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model, (24,)


def _cnn(tf):
    tf.keras.utils.set_random_seed(0)
    layers = tf.keras.layers
    model = tf.keras.Sequential([
        tf.keras.Input((10, 10, 3)),
        layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
        layers.Dropout(0.3), layers.Flatten(), layers.Dense(6)])
    model.compile(tf.keras.optimizers.Adam(1e-3),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, (10, 10, 3)


def _data(shape, count=40, classes=6):
    rng = np.random.default_rng(2)
    return (rng.standard_normal((count, *shape)).astype(np.float32),
            rng.integers(0, classes, count).astype(np.int32))


def _state(model):
    """Every variable in order (paths differ between the two models: Keras numbers its
    layer names per process)."""
    return [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables]


@pytest.mark.parametrize("build", [_mlp, _cnn])
def test_fit_on_the_rewritten_step_trains_like_fit(tf, build):
    x, y = _data(build(tf)[1])
    plain, _ = build(tf)
    # 40 samples in batches of 16: the last batch has 8, through the same rewritten step
    history_a = plain.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    rewritten, _ = build(tf)
    # kept even where its estimate is no lower (the small CNN, once the fusion guard has
    # left out the edges TF's merged bias gradients would close into cycles): what is
    # tested is that fit runs the rewritten step and trains the same
    assert graphmem.keras.rewrite_train_step(rewritten, policy="memory",
                                             keep_worse=True) is rewritten
    history_b = rewritten.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0).history
    report = rewritten.train_step_report
    assert isinstance(report, graphmem.RewriteResult)
    assert report.plan.copied_ops > 0 and not report.reverted
    assert history_a == history_b
    assert len(set(history_a["loss"])) == 3
    a, b = _state(plain), _state(rewritten)
    assert len(a) == len(b)
    for (name, value_a), (_, value_b) in zip(a, b, strict=True):
        np.testing.assert_array_equal(value_a, value_b, err_msg=name)
    if build is _cnn:
        names = [n for n, _ in a]
        assert any("moving_mean" in n for n in names)
        assert any("seed_generator" in n for n in names)
    # train_on_batch runs the same rewritten step
    loss_a = plain.train_on_batch(x[:16], y[:16])
    loss_b = rewritten.train_on_batch(x[:16], y[:16])
    assert loss_a == loss_b


def test_refuses_what_it_cannot_rewrite(tf):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
    with pytest.raises(graphmem.UsageError, match="compile"):
        graphmem.keras.rewrite_train_step(model)
    model.compile("adam", "mse", steps_per_execution=2)
    with pytest.raises(graphmem.UsageError, match="steps_per_execution"):
        graphmem.keras.rewrite_train_step(model)
    model.compile("adam", "mse", run_eagerly=True)
    with pytest.raises(graphmem.UsageError, match="eagerly"):
        graphmem.keras.rewrite_train_step(model)
