"""TF2 train steps saved as SavedModels, for tests: a dense chain whose activation is the
caller's (a `tf.custom_gradient`, for the tests of how graphmem reads those)."""

from __future__ import annotations

import os
from pathlib import Path


def save_dense_step(path: Path, act, layers: int, width: int, optimizer: str = "adam",
                    scale: float = 0.2) -> Path:
    """`layers` square matmuls, each followed by `act`, a softmax cross entropy over the
    first 10 units; Keras' Adam or SGD with momentum; traced once and saved at `path`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.ws = [tf.Variable(tf.random.stateless_normal([width, width], [i, 1]) * scale)
                       for i in range(layers)]
            self.opt = keras.optimizers.Adam(1e-3) if optimizer == "adam" else \
                keras.optimizers.SGD(0.01, momentum=0.9)

        @tf.function(input_signature=[tf.TensorSpec([None, width]),
                                      tf.TensorSpec([None], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                h = x
                for w in self.ws:
                    h = act(tf.matmul(h, w))
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, h[:, :10]))
            grads = tape.gradient(loss, self.ws)
            self.opt.apply_gradients(zip(grads, self.ws, strict=True))
            return loss

    trainer = Trainer()
    trainer.train_step(tf.zeros([2, width]), tf.zeros([2], tf.int32))
    tf.saved_model.save(trainer, str(path))
    return path


def save_batch_norm_step(path: Path, size: int = 4, channels: int = 1024) -> Path:
    """Keras convolutions, each with a batch norm (built unfused) and ReLU6, global
    pooling and a dense layer, trained by Keras' SGD with momentum: the tail of a
    MobileNetV2. The last batch norm has `channels` (at least 1024) channels, so that its
    momentum product is held back for its gradient (passes/early_updates.py)."""

    def layers(keras):
        return [keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
                keras.layers.BatchNormalization(), keras.layers.ReLU(6.0),
                keras.layers.Conv2D(channels, 1, use_bias=False),
                keras.layers.BatchNormalization(), keras.layers.ReLU(6.0),
                keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]

    return _save_image_step(path, size, layers)


def save_hard_swish_step(path: Path, side: int = 32, batch: int = 4) -> Path:
    """Four Keras convolutions, each with a batch norm and Keras' hard swish,
    `x * (relu6(x + 3) / 6)` (MobileNetV3's activation), global pooling and a dense head;
    Keras' SGD with momentum; traced for batches of `batch` (Grappler's arithmetic
    optimizer rebuilds a product only where its shape is known, as Keras applications
    saved for a batch size have it). The division is read by the product and by the
    product's gradient: once that gradient reads a recompute copy, Grappler would fold the
    forward division into the product and round it differently. The batch norms' names
    sort before the activations' (as Keras MobileNetV3's do): Grappler's common subgraph
    elimination orders a product's inputs by name, and the rebuilt product then differs
    from the product as written."""

    def layers(keras):
        out = []
        for k, width in enumerate((8, 16, 16, 16)):
            out += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False),
                    keras.layers.BatchNormalization(name=f"bn{k}"),
                    keras.layers.Activation("hard_swish", name=f"swish{k}")]
        return [*out, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]

    return _save_image_step(path, side, layers, batch)


def save_swish_step(path: Path, side: int = 32, batch: int = 4) -> Path:
    """Four Keras convolutions, each with a batch norm and Keras' swish (`tf.nn.silu`,
    EfficientNet's activation), global pooling and a dense head; Keras' SGD with momentum.
    silu's gradient recomputes `sigmoid(x)` under `control_dependencies([dy])`, an op that
    only that control edge keeps apart from the forward `sigmoid(x)`, which the oneDNN
    remapper fuses with its product into `_MklSwish`."""

    def layers(keras):
        out = []
        for k, width in enumerate((8, 16, 16, 16)):
            out += [keras.layers.Conv2D(width, 3, padding="same", use_bias=False,
                                        name=f"conv{k}"),
                    keras.layers.BatchNormalization(name=f"bn{k}"),
                    keras.layers.Activation("swish", name=f"swish{k}")]
        return [*out, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]

    return _save_image_step(path, side, layers, batch)


def save_squeeze_excite_step(path: Path, side: int = 16, batch: int = 4) -> Path:
    """Two EfficientNet-style blocks in small: a convolution, batch norm and swish, then
    squeeze and excitation (global pooling, a 1x1 convolution with a bias and swish, a 1x1
    convolution with a sigmoid, the product with the block's activations); global pooling
    and a dense head; Keras' SGD with momentum. The squeeze's `BiasAdd` is read by
    `x * sigmoid(x)`, which the oneDNN remapper fuses into `_MklSwish`."""

    def model(keras):
        x = inputs = keras.Input((side, side, 3))
        for k, width in enumerate((16, 24)):
            x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False,
                                    name=f"conv{k}")(x)
            x = keras.layers.BatchNormalization(name=f"bn{k}")(x)
            x = keras.layers.Activation("swish", name=f"swish{k}")(x)
            se = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
            se = keras.layers.Conv2D(4, 1, activation="swish", name=f"se_reduce{k}")(se)
            se = keras.layers.Conv2D(width, 1, activation="sigmoid", name=f"se_expand{k}")(se)
            x = keras.layers.Multiply(name=f"se_excite{k}")([x, se])
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(10)(x))

    return _save_image_step(path, side, model, batch)


def save_vgg_head_step(path: Path, side: int = 64, units: int = 512) -> Path:
    """A small VGG as a Keras train step: two blocks of two 3x3 convolutions (32 and 64
    channels) with max pooling, then a dense layer of `units` over the flattened feature
    map (its weight (side/4)^2 * 64 x units: 32 MiB at the defaults, from inputs of a few
    hundred KiB) and a dense head; Keras' SGD with momentum."""

    def layers(keras):
        conv = dict(padding="same", activation="relu")
        return [keras.layers.Conv2D(32, 3, **conv), keras.layers.Conv2D(32, 3, **conv),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(64, 3, **conv), keras.layers.Conv2D(64, 3, **conv),
                keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                keras.layers.Dense(units, activation="relu", name="fc1"),
                keras.layers.Dense(10, name="head")]

    return _save_image_step(path, side, layers)


def save_residual_step(path: Path, side: int = 32, blocks: int = 4, width: int = 16) -> Path:
    """A Keras functional ResNet: `blocks` residual blocks of two 3x3 convolutions, each
    with a batch norm (built unfused: `x * mul + sub`), added to the block's input and a
    ReLU; global pooling and a dense head, Keras' SGD with momentum. The adds of each
    block form sums Grappler rebuilds in another order (a batch norm's `add_1` read by the
    residual add), and their gradients' `Sum`s are the kind Grappler folds away."""

    def model(keras):
        x = inputs = keras.Input((side, side, 3))
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
        for _ in range(blocks):
            y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(x)
            y = keras.layers.ReLU()(keras.layers.BatchNormalization()(y))
            y = keras.layers.Conv2D(width, 3, padding="same", use_bias=False)(y)
            y = keras.layers.BatchNormalization()(y)
            x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
        x = keras.layers.GlobalAveragePooling2D()(x)
        return keras.Model(inputs, keras.layers.Dense(10)(x))

    return _save_image_step(path, side, model)


def save_linear_residual_step(path: Path, side: int = 16, blocks: int = 4,
                              width: int = 16) -> Path:
    """MobileNetV2/V3-style linear bottlenecks in small: a stem convolution, then `blocks`
    blocks of a 1x1 convolution, batch norm and ReLU, a 1x1 projection and its batch norm
    (built unfused: `x * mul + sub`) added to the block's input with no activation after,
    so that each block's add reads the one before; global pooling and a dense head behind
    a dropout (its `Shape` of the activation it masks stays: the batch is unknown); Keras'
    SGD with momentum. Grappler rebuilds each add with its batch norm's `add_1`: a tree
    whose root the next block's convolution and add, and its gradients, also read."""

    def model(keras):
        x = inputs = keras.Input((side, side, 3))
        x = keras.layers.Conv2D(width, 3, padding="same", use_bias=False, name="stem")(x)
        for k in range(blocks):
            y = keras.layers.Conv2D(2 * width, 1, use_bias=False, name=f"expand{k}")(x)
            y = keras.layers.ReLU()(keras.layers.BatchNormalization(name=f"bn{k}a")(y))
            y = keras.layers.Conv2D(width, 1, use_bias=False, name=f"project{k}")(y)
            y = keras.layers.BatchNormalization(name=f"bn{k}b")(y)
            x = keras.layers.Add(name=f"add{k}")([x, y])
        x = keras.layers.GlobalAveragePooling2D()(x)
        x = keras.layers.Dropout(0.2, seed=1)(x)
        return keras.Model(inputs, keras.layers.Dense(10)(x))

    return _save_image_step(path, side, model)


def _save_image_step(path: Path, side: int, layers, batch: int | None = None) -> Path:
    """A Keras model over side x side x 3 images (`layers(keras)`: a list of layers made a
    Sequential, or a model), a softmax cross entropy over its logits, Keras' SGD with
    momentum; traced once (for batches of `batch`, any when None) and saved at `path`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import tensorflow as tf

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            keras.utils.set_random_seed(0)
            built = layers(keras)
            self.model = built if isinstance(built, keras.Model) else \
                keras.Sequential([keras.Input((side, side, 3)), *built])
            self.opt = keras.optimizers.SGD(0.01, momentum=0.9)
            # a dropout's seed state is a variable the step updates: tracked, so it is saved
            self.seeds = [layer.seed_generator.state for layer in self.model._flatten_layers()
                          if getattr(layer, "seed_generator", None) is not None]

        @tf.function(input_signature=[tf.TensorSpec([batch, side, side, 3]),
                                      tf.TensorSpec([batch], tf.int32)])
        def train_step(self, x, y):
            with tf.GradientTape() as tape:
                logits = self.model(x, training=True)
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    y, logits))
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.opt.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
            return loss

    trainer = Trainer()
    trainer.train_step(tf.zeros([batch or 2, side, side, 3]), tf.zeros([batch or 2], tf.int32))
    tf.saved_model.save(trainer, str(path))
    return path


def save_pointwise_gelu_step(path: Path, side: int = 16) -> Path:
    """ConvNeXt's block in small: a depthwise convolution, a layer norm, Keras' `Dense` on
    the 4-D result (a `Tensordot`, which reshapes to a computed shape) with exact GELU, and
    a second `Dense`; the batch left unknown, as Keras applications save it. A copy of the
    `Tensordot` reshape gets other dimensions from TF's shape inference than the original
    unless it reads the original's shape, and Grappler then regroups the GELU gradient's
    products in the original and not in the rewrite."""

    def layers(keras):
        out = [keras.layers.Conv2D(16, 3, padding="same")]
        for _ in range(3):
            out += [keras.layers.DepthwiseConv2D(3, padding="same"),
                    keras.layers.LayerNormalization(epsilon=1e-6),
                    keras.layers.Dense(64, activation="gelu"), keras.layers.Dense(16)]
        return [*out, keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]

    return _save_image_step(path, side, layers)
