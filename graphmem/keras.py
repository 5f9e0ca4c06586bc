"""`graphmem.keras.rewrite_train_step(model)`: Keras `model.fit` on a rewritten train step.

Keras 3 (TensorFlow backend) runs `fit` through `model.train_function(iterator)`, which it
builds from `model.train_step` unless one is set. After `compile`, this module sets one that
takes the next batch, and on the first batch traces `model.train_step` as a tf.function for
that batch's structure (batch dimension left open, so the last, smaller batch fits too) and
rewrites it with `graphmem.function`; every batch then runs the rewritten step on the
model's own variables. `model.train_step_report` is the rewrite's RewriteResult once the
first batch has run.

Supported: `fit` and `train_on_batch` with the default distribution strategy,
`steps_per_execution=1`, batches of one structure (x, y and optional sample weights) with
the same inner shapes and dtypes (a batch of another structure, as `train_on_batch`
may give, is rewritten on its own when it first comes). Not supported (refused with a clear error): other
distribution strategies, `steps_per_execution > 1`, `run_eagerly=True` (nothing to
rewrite). The step runs without XLA even if `compile(jit_compile=True)` asked for it.
`evaluate` and `predict` are left as Keras builds them. `compile` again resets the train
function: call `rewrite_train_step` again after it.
"""

from __future__ import annotations

from typing import Any

from graphmem.errors import UsageError


def rewrite_train_step(model: Any, policy: str = "memory", **options: Any) -> Any:
    """Make `model.fit` (and `train_on_batch`) run a graphmem-rewritten train step.

    Call after `model.compile(...)`. `policy` and `options` are `graphmem.rewrite`'s.
    Returns the model."""
    from graphmem.runtime.tf_loader import tensorflow

    tf = tensorflow("graphmem.keras rewrites a Keras train step")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", True):
        raise UsageError("rewrite_train_step needs a compiled model: call model.compile first")
    if getattr(model, "run_eagerly", False):
        raise UsageError("the model runs eagerly (run_eagerly=True): there is no graph to "
                         "rewrite")
    if getattr(model, "steps_per_execution", 1) != 1:
        raise UsageError("rewrite_train_step supports steps_per_execution=1 only")
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and strategy is not tf.distribute.get_strategy():
        raise UsageError("rewrite_train_step supports the default distribution strategy only")
    options.setdefault("policy", policy)
    model.train_function = _TrainFunction(tf, model, options)
    model.train_step_report = None
    return model


class _TrainFunction:
    """What Keras's fit loop calls per batch: the next batch, then the rewritten step
    (rewritten on the first batch)."""

    def __init__(self, tf, model, options: dict) -> None:
        self.tf = tf
        self.model = model
        self.options = options
        self.steps: dict[str, Any] = {}  # one rewritten step per batch structure

    def __call__(self, iterator):
        data = self._next(iterator)
        key = repr(self.tf.nest.map_structure(
            lambda t: None if t is None else (t.dtype.name, tuple(t.shape[1:])), data))
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = self._rewrite(data)
        return step(data)

    def _next(self, iterator):
        tf = self.tf
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            data = iterator.get_next_as_optional()
            if not data.has_value():
                raise StopIteration
            data = data.get_value()
        else:  # train_on_batch: a generator of one batch
            data = next(iter(iterator))
        # Keras marks absent sample weights as empty Optionals (fit) or None
        # (train_on_batch): the step sees (x, y), as `unpack_x_y_sample_weight` would
        data = tf.nest.map_structure(
            lambda t: None if t is None or isinstance(t, tf.experimental.Optional) else
            tf.convert_to_tensor(t), data)
        if isinstance(data, (tuple, list)):
            data = tuple(data)
            while len(data) > 1 and data[-1] is None:
                data = data[:-1]
        return data

    def _rewrite(self, data):
        import graphmem

        tf = self.tf
        model = self.model

        @tf.function
        def train_step(batch):
            return model.train_step(batch)

        def open_batch(t):
            if t is None:
                return None
            t = tf.convert_to_tensor(t)
            shape = t.shape.as_list()
            return tf.TensorSpec([None] + shape[1:] if shape else shape, t.dtype)

        spec = tf.nest.map_structure(open_batch, data)
        first = next((t for t in tf.nest.flatten(data) if t is not None), None)
        options = dict(self.options)
        if first is not None and len(first.shape) and first.shape[0] is not None:
            options.setdefault("batch_size", int(first.shape[0]))
        step = graphmem.function(train_step, spec, **options)
        model.train_step_report = step.report
        return step
