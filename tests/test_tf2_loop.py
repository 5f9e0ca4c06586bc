"""A TF2 train step with a v2 while loop: its library also holds the loop's bodies and their
gradients (all with backward ops); graphmem finds the train step and rewrites it safely."""

import pytest

from graphmem.formats import load_model
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

pytestmark = pytest.mark.tf


@pytest.fixture(scope="module")
def loop_step(tmp_path_factory):
    import tensorflow as tf

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.w_in = tf.Variable(tf.random.stateless_normal([8, 16], seed=[1, 2]) * 0.3)
            self.w = tf.Variable(tf.random.stateless_normal([16, 16], seed=[3, 4]) * 0.3)
            self.w_out = tf.Variable(tf.random.stateless_normal([16, 1], seed=[5, 6]) * 0.3)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def train_step(self, x):
            with tf.GradientTape() as tape:
                h0 = tf.nn.relu(x @ self.w_in)
                _, h = tf.while_loop(lambda i, h: i < 6,
                                     lambda i, h: (i + 1, tf.tanh(h @ self.w) + h0),
                                     [tf.constant(0), h0])
                loss = tf.reduce_mean(tf.square(tf.nn.relu(h) @ self.w_out))
            variables = [self.w_in, self.w, self.w_out]
            for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
                v.assign_sub(0.05 * g)
            return loss

    step = Step()
    step.train_step(tf.zeros([2, 8]))
    path = tmp_path_factory.mktemp("loop") / "saved"
    tf.saved_model.save(step, str(path))
    return path


def test_the_train_step_is_found_among_loop_functions(loop_step):
    model = load_model(loop_step)
    assert model.function_name is not None and "train_step" in model.function_name


@pytest.mark.parametrize("policy", ["memory", "speed"])
def test_loop_train_step_rewrites_train_identically(loop_step, policy, tmp_path):
    out = tmp_path / "out"
    rewrite_file(loop_step, out, RewriteOptions(policy, [], 16, keep_worse=True))
    result = verify(str(loop_step), str(out), RunSpec(batch_size=16, grappler=False), 3,
                    0.0, 0.0)
    assert result.same_training, result.mismatches
    assert result.variables_compared == 3


def test_forward_loop_and_the_ops_after_it_stay_forward(loop_step):
    # the gradient makes empty tensor lists (in the gradient scope) that the forward loop
    # pushes into; they must not drag the forward loop into the backward region
    from graphmem.analysis.regions import analyze_regions
    from graphmem.graph.workspace import Workspace

    ws = Workspace.open(load_model(loop_step))
    ix = ws.index
    regions = analyze_regions(ix, None, 16)
    loops = [i for i in range(len(ix)) if ix.ops[i] in ("While", "StatelessWhile")]
    forward_loops = [i for i in loops if i in regions.forward]
    backward_loops = [i for i in loops if i in regions.backward]
    assert len(forward_loops) == 1 and len(backward_loops) == 1
    assert any(ix.ops[ix.data_inputs[forward_loops[0]][k][0]] == "EmptyTensorList"
               for k in range(len(ix.data_inputs[forward_loops[0]])))
    assert regions.loss and regions.loss[0][0] in regions.forward
