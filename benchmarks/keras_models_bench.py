#!/usr/bin/env python
"""Keras models as TF2 train steps: does every rewrite train the same, and what is estimated?

Usage::

    python benchmarks/keras_models_bench.py [--models ResNet50,EfficientNetB0,...]

Each model (Keras 3, random weights, 10 classes) is wrapped in a `tf.Module` whose
`tf.function` train step runs the model under a `GradientTape` and applies SGD with momentum
(the text models: Adam), saved as a SavedModel, and rewritten with `--policy memory`,
`--policy speed` and `--swap` (the text models also with `--recompute-loops`). Each rewrite
is trained 2 steps side by side with the original with Grappler off (`verify --exact`).
Printed: the estimated peak after the rewrite relative to the original's, and whether
training was bit-identical. Keras applications use batch 8, the text models batch 16.
Expected duration on 2 cores: 1-3 minutes per model (all of them: about 20).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

APPLICATIONS = {"ResNet50": 32, "DenseNet121": 32, "InceptionV3": 75, "Xception": 71,
                "MobileNetV3Small": 64, "EfficientNetB0": 64}
TEXT = ("lstm2", "gru_bi", "conv1d")
STEPS, VOCAB, WIDTH = 32, 500, 64
# decoder-only language models (layers, width, heads, vocabulary), trained on next-token
# prediction; `size` is their sequence length. transformer_lm: the base transformer of
# Vaswani et al. (2017) as a causal LM, pre-layer-norm as GPT-2
LMS = {"transformer_lm": (6, 512, 8, 8192)}
# LSTM language models (layers, units, vocabulary): lstm_lm is the large model of Zaremba
# et al. (2014), 2 x 1500 units over 10,000 words, trained at sequence length 35
RNN_LMS = {"lstm_lm": (2, 1500, 10000)}


def _application(name: str, size: int):
    import keras
    import numpy as np

    model = getattr(keras.applications, name)(input_shape=(size, size, 3), weights=None,
                                              classes=10)
    for layer in model._flatten_layers():
        # unadapted, it divides by zero (ConvNeXt's and EfficientNetV2's come with theirs)
        if type(layer).__name__ == "Normalization" and layer.input_mean is None:
            layer.adapt(np.random.standard_normal([16, size, size, 3]).astype("float32"))
    return model, [None, size, size, 3], "float32"


def _text(kind: str):
    import keras

    inp = keras.Input((STEPS,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH)(inp)
    if kind == "lstm2":
        h = keras.layers.LSTM(WIDTH, return_sequences=True)(h)
        h = keras.layers.LSTM(WIDTH)(h)
    elif kind == "gru_bi":
        h = keras.layers.Bidirectional(keras.layers.GRU(WIDTH, return_sequences=True))(h)
        h = keras.layers.GlobalAveragePooling1D()(h)
    else:
        h = keras.layers.Conv1D(WIDTH, 5, padding="same", activation="relu")(h)
        h = keras.layers.Dropout(0.2, seed=1)(h)
        h = keras.layers.Conv1D(WIDTH, 5, padding="same", activation="relu")(h)
        h = keras.layers.GlobalMaxPooling1D()(h)
    return keras.Model(inp, keras.layers.Dense(10)(h)), [None, STEPS], "int32"


def _language_model(name: str, seq: int):
    import keras

    depth, width, heads, vocab = LMS[name]

    class PositionEmbedding(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.table = keras.layers.Embedding(seq, width)

        def call(self, h):
            return h + self.table(keras.ops.arange(keras.ops.shape(h)[1]))

    inp = keras.Input((seq,), dtype="int32")
    h = PositionEmbedding()(keras.layers.Embedding(vocab, width)(inp))
    for n in range(depth):
        a = keras.layers.LayerNormalization()(h)
        a = keras.layers.MultiHeadAttention(heads, width // heads)(a, a, use_causal_mask=True)
        h = keras.layers.Add()([h, keras.layers.Dropout(0.1, seed=2 * n)(a)])
        f = keras.layers.LayerNormalization()(h)
        f = keras.layers.Dense(4 * width, activation="gelu")(f)
        f = keras.layers.Dense(width)(f)
        h = keras.layers.Add()([h, keras.layers.Dropout(0.1, seed=2 * n + 1)(f)])
    logits = keras.layers.Dense(vocab)(keras.layers.LayerNormalization()(h))
    return keras.Model(inp, logits), [None, seq], "int32"


def _lstm_language_model(name: str, seq: int):
    import keras

    depth, units, vocab = RNN_LMS[name]
    inp = keras.Input((seq,), dtype="int32")
    h = keras.layers.Embedding(vocab, units)(inp)
    for n in range(depth):
        h = keras.layers.LSTM(units, return_sequences=True)(h)
        h = keras.layers.Dropout(0.65, seed=n)(h)
    return keras.Model(inp, keras.layers.Dense(vocab)(h)), [None, seq], "int32"


def build(name: str, path: Path, size: int | None = None) -> None:
    """Save `name` as a TF2 train-step SavedModel at `path`; an application at `size` px
    (its canonical size in benchmarks/networks_bench.py) instead of this benchmark's."""
    import keras

    from graphmem.runtime import tf_loader

    tf = tf_loader.tensorflow("to build the benchmark models")
    keras.utils.set_random_seed(0)
    if name in LMS:
        model, shape, dtype = _language_model(name, size or STEPS)
    elif name in RNN_LMS:
        model, shape, dtype = _lstm_language_model(name, size or STEPS)
    else:
        model, shape, dtype = _text(name) if name in TEXT else _application(
            name, size or APPLICATIONS[name])
    lm = name in LMS or name in RNN_LMS
    text = name in TEXT or lm
    seeds = [layer.seed_generator.state for layer in model._flatten_layers()
             if getattr(layer, "seed_generator", None) is not None]

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.seeds = model, seeds  # seed states are variables to save
            self.opt = keras.optimizers.Adam(1e-3) if text else \
                keras.optimizers.SGD(0.01, momentum=0.9)

        @tf.function(input_signature=[tf.TensorSpec(shape, dtype),
                                      tf.TensorSpec([None], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                if lm:  # each position predicts the next token of x
                    y, logits = x[:, 1:], logits[:, :-1]
                loss = tf.reduce_mean(
                    tf.keras.losses.sparse_categorical_crossentropy(
                        y, logits, from_logits=text))  # applications end in softmax
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            return loss

    trainer = Trainer()
    trainer.train_step(tf.zeros([2, *shape[1:]], dtype), tf.zeros([2], tf.int32))
    tf.saved_model.save(trainer, str(path))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join([*APPLICATIONS, *TEXT]))
    args = ap.parse_args(argv)
    from graphmem.passes.swap import SwapOptions
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    print(f"{'model':<18} {'variant':<8} {'est. x':>7} {'copied':>7}  same training")
    with tempfile.TemporaryDirectory(prefix="graphmem-keras-") as tmp:
        for name in args.models.split(","):
            batch = 16 if name in TEXT else 8
            src = Path(tmp) / name
            build(name, src)
            variants = {"memory": RewriteOptions("memory", [], batch),
                        "speed": RewriteOptions("speed", [], batch),
                        "swap": RewriteOptions("none", [], batch, swap=SwapOptions())}
            if name in TEXT:
                variants["loops"] = RewriteOptions("memory", [], batch, recompute_loops=True)
            for variant, options in variants.items():
                options.keep_worse = True  # show what each rewrite does, even when worse
                out = Path(tmp) / f"{name}_{variant}"
                result = rewrite_file(src, out, options)
                same = verify(str(src), str(out), RunSpec(batch_size=batch, grappler=False),
                              2, 0.0, 0.0).same_training
                ratio = result.after.peak_bytes / result.before.peak_bytes
                print(f"{name:<18} {variant:<8} {ratio:>7.2f} {result.plan.copied_ops:>7}  "
                      f"{'yes' if same else 'NO'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
