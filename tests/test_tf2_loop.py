"""A TF2 train step with a v2 while loop: its library also holds the loop's bodies and their
gradients (all with backward ops); graphmem finds the train step and rewrites it safely."""

import pytest

from graphmem.formats import load_model
from graphmem.graph.names import is_copy
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


@pytest.fixture(scope="module")
def stacked_loops(tmp_path_factory):
    """Two stacked recurrent loops (the second reads the first's per-step outputs), and a
    twin whose second loop draws random numbers with state inside its body."""
    import tensorflow as tf

    def build(stateful_random: bool, path):
        class Step(tf.Module):
            def __init__(self):
                super().__init__()
                self.w1 = tf.Variable(tf.random.stateless_normal([32, 32], seed=[1, 2]) * 0.2)
                self.w2 = tf.Variable(tf.random.stateless_normal([32, 32], seed=[3, 4]) * 0.2)
                self.w_out = tf.Variable(tf.random.stateless_normal([32, 1], seed=[5, 6]))

            def _rnn(self, xs, w, noisy):
                def body(i, h, out):
                    h = tf.tanh(h @ w + xs.read(i))
                    if noisy:
                        h = h + 0.0 * tf.random.uniform(tf.shape(h))
                    return i + 1, h, out.write(i, h)

                steps = xs.size()
                out = tf.TensorArray(tf.float32, size=steps)
                h0 = tf.zeros_like(xs.read(0))
                _, _, out = tf.while_loop(lambda i, h, o: i < steps, body, [0, h0, out])
                return out

            @tf.function(input_signature=[tf.TensorSpec([16, None, 32], tf.float32)])
            def train_step(self, x):
                with tf.GradientTape() as tape:
                    xs = tf.TensorArray(tf.float32, size=16).unstack(x)
                    h1 = self._rnn(xs, self.w1, False)
                    h2 = self._rnn(h1, self.w2, stateful_random)
                    loss = tf.reduce_mean(tf.square(h2.stack()[-1] @ self.w_out))
                variables = [self.w1, self.w2, self.w_out]
                for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
                    v.assign_sub(0.05 * g)
                return loss

        step = Step()
        step.train_step(tf.zeros([16, 2, 32]))
        tf.saved_model.save(step, str(path))
        return path

    root = tmp_path_factory.mktemp("stacked")
    return build(False, root / "pure"), build(True, root / "noisy")


def test_replayable_loops_are_the_ones_without_state(stacked_loops):
    from graphmem.analysis.regions import analyze_regions
    from graphmem.analysis.replayable_loops import replayable_loops
    from graphmem.graph.workspace import Workspace

    found = []
    for path in stacked_loops:
        ws = Workspace.open(load_model(path))
        library = {f.signature.name: f for f in ws.model.graph_def.library.function}
        ix = ws.index
        forward = analyze_regions(ix, None, 8).forward
        loops = [i for i in range(len(ix)) if ix.ops[i] in ("While", "StatelessWhile")
                 and i in forward]
        assert len(loops) == 2
        found.append(len(replayable_loops(ix, library) & set(loops)))
    assert found == [2, 1]  # the loop drawing random numbers with state is not replayed


def test_recomputed_loops_train_identically(stacked_loops, tmp_path):
    pure = stacked_loops[0]
    out = tmp_path / "out"
    result = rewrite_file(pure, out, RewriteOptions("memory", [], 8, keep_worse=True,
                                                    recompute_loops=True))
    copied_loops = [s for s in result.plan.segments
                    if any(t.split(":")[0].endswith("while") for t in s.targets)]
    assert copied_loops and result.plan.copied_ops > 0
    from graphmem.graph.workspace import Workspace

    ix = Workspace.open(load_model(out)).index
    copies = [i for i in range(len(ix)) if ix.ops[i] in ("While", "StatelessWhile")
              and is_copy(ix.names[i])]
    assert copies
    for c in copies:  # held back: the copy waits for the backward pass to reach it
        assert any("gradient_tape/" in ix.names[a] for a in ix.ancestors([c]))
    check = verify(str(pure), str(out), RunSpec(batch_size=8, grappler=False), 3, 0.0, 0.0)
    assert check.same_training, check.mismatches
