"""The recompute pass leaves what Grappler sums as the original has it, so that TF, which
runs the graph after Grappler, rounds the rewritten graph's sums as it rounds the
original's (with Grappler on, as users train).

Found on Keras NASNetMobile, which trained bit for bit with Grappler off and drifted with
it on (1e-6 in the first step's loss, 1e-2 after five): a checkpoint inside a sum Grappler
rebuilds (a batch norm's `add_1` read by a cell's add) took its op out of the sum, and a
segment held back by a gradient's `Sum` over empty axes kept Grappler from folding it,
which changed the order of a gradient `AddN`'s terms."""

from __future__ import annotations

import pytest

from graphmem.analysis.activations import analyze_forward
from graphmem.analysis.regions import analyze_regions
from graphmem.analysis.removable_ops import may_be_removed
from graphmem.graph.names import is_copy, is_hold, original_name
from graphmem.passes.recompute import _triggers, apply_recompute
from tests.graphbuilder import G

X = (8, 16)
C = (16,)


def _residual_sum() -> G:
    """relu(a * scale + beta + a), an unfused batch norm's output added to its input: a
    sum of two shapes Grappler rebuilds; a backward pass reading the activations."""
    g = G()
    g.op("x", "Placeholder", shape=X)
    g.op("scale", "Const", shape=C)
    g.op("beta", "Const", shape=C)
    g.op("a", "Relu", "x", shape=X)
    g.op("m", "Mul", "a", "scale", shape=X)
    g.op("inner", "AddV2", "m", "beta", shape=X)
    g.op("root", "AddV2", "inner", "a", shape=X)
    g.op("r", "Relu", "root", shape=X)
    g.op("gradients/g", "Const", shape=X)
    g.op("gradients/d1", "Mul", "gradients/g", "r", shape=X)
    g.op("gradients/d2", "ReluGrad", "gradients/d1", "root", shape=X)
    g.op("gradients/d3", "Mul", "gradients/d2", "scale", shape=X)
    g.op("gradients/d4", "ReluGrad", "gradients/d3", "a", shape=X)
    return g


def _recompute(g: G, checkpoint: str):
    ix = g.index()
    regions = analyze_regions(ix)
    facts = analyze_forward(ix, regions)
    plan = apply_recompute(ix, regions, facts, [(ix.id_of[checkpoint], 0)])
    return plan, g.index()


def test_a_checkpoint_inside_a_regrouped_sum_moves_to_the_sums_result():
    g = _residual_sum()
    plan, new = _recompute(g, "inner")
    assert plan.checkpoints_to_tree_roots == 1
    assert plan.copied_ops > 0
    inner = new.id_of["inner"]
    assert [new.names[r] for r in new.data_consumers(inner)] == ["root"]  # still one reader
    assert not any(is_copy(n) and original_name(n) == "inner" for n in new.names)
    # the backward reads of the sum's result are its own: it is the checkpoint now
    assert new.names[new.data_inputs[new.id_of["gradients/d2"]][1][0]] == "root"


def test_copies_of_a_regrouped_sum_are_held_back_through_an_identity():
    """With the checkpoint below the sum (`m`), the copy of its inner add reads no copy and
    is where the segment starts: an ordering edge on it would keep Grappler from rebuilding
    the copy's sum as the original's; an Identity before it carries the edge. So it is for
    every segment's first copies: no copy carries a control edge."""
    g = _residual_sum()
    plan, new = _recompute(g, "m")
    assert plan.checkpoints_to_tree_roots == 0
    holds = [i for i, n in enumerate(new.names) if is_hold(n)]
    assert plan.held_through_identity == len(holds) > 0
    assert all(new.ops[i] == "Identity" and new.control_inputs[i] for i in holds)
    assert not any(new.control_inputs[i] for i, n in enumerate(new.names) if is_copy(n))
    copy = next(i for i, n in enumerate(new.names)
                if is_copy(n) and original_name(n) == "inner")
    assert new.control_inputs[copy] == []
    hold = new.data_inputs[copy][0][0]
    assert new.ops[hold] == "Identity" and new.control_inputs[hold]
    assert new.data_inputs[hold] == [(new.id_of["m"], 0)]
    copied_root = next(i for i, n in enumerate(new.names)
                       if is_copy(n) and original_name(n) == "root")
    assert new.data_inputs[copied_root][0] == (copy, 0)


def test_a_checkpoint_on_an_op_tf_merges_with_its_reader_moves_to_the_readers_result():
    """A convolution's `BiasAdd` read only by its `Relu`: TF runs the three as one kernel,
    and a copy reading the `BiasAdd` would split them (oneDNN's kernel with the ReLU sums
    in another order). The checkpoint moves to the `Relu`, which the backward reads."""
    g = G()
    g.op("x", "Placeholder", shape=(2, 8, 8, 3))
    g.op("w", "Const", shape=(3, 3, 3, 4))
    g.op("b", "Const", shape=(4,))
    g.op("conv", "Conv2D", "x", "w", shape=(2, 8, 8, 4))
    g.op("bias", "BiasAdd", "conv", "b", shape=(2, 8, 8, 4))
    g.op("relu", "Relu", "bias", shape=(2, 8, 8, 4))
    g.op("head", "Tanh", "relu", shape=(2, 8, 8, 4))
    g.op("gradients/g", "Const", shape=(2, 8, 8, 4))
    g.op("gradients/d1", "TanhGrad", "head", "gradients/g", shape=(2, 8, 8, 4))
    g.op("gradients/d2", "ReluGrad", "gradients/d1", "relu", shape=(2, 8, 8, 4))
    plan, new = _recompute(g, "bias")
    assert plan.checkpoints_past_fusions == 1
    bias = new.id_of["bias"]
    assert [new.names[r] for r in new.data_consumers(bias)] == ["relu"]  # still one reader
    assert not any(is_copy(n) and original_name(n) in ("bias", "relu") for n in new.names)


def _broadcast_gradient() -> G:
    """The gradient of `y = a + b` as TF writes it: sums over the axes
    BroadcastGradientArgs finds, reshaped to each input's shape."""
    g = G()
    g.op("x", "Placeholder", shape=X)
    g.op("a", "Relu", "x", shape=X)
    g.op("b", "Tanh", "x", shape=X)
    g.op("y", "AddV2", "a", "b", shape=X)
    g.op("gradients/dy", "Sigmoid", "y", shape=X)
    g.op("gradients/Shape", "Shape", "a", shape=(2,), dtype=3)
    g.op("gradients/Shape_1", "Shape", "b", shape=(2,), dtype=3)
    g.op("gradients/BroadcastGradientArgs", "BroadcastGradientArgs", "gradients/Shape",
         "gradients/Shape_1", shape=(None,), dtype=3, n_out=2)
    g.op("gradients/Sum", "Sum", "gradients/dy", "gradients/BroadcastGradientArgs",
         shape=X)
    g.op("gradients/Reshape", "Reshape", "gradients/Sum", "gradients/Shape", shape=X)
    g.op("gradients/use", "ReluGrad", "gradients/Reshape", "a", shape=X)
    return g


def test_ops_grappler_folds_away_are_known():
    ix = _broadcast_gradient().index()
    removable = {ix.names[i] for i in range(len(ix)) if may_be_removed(ix, i)}
    assert removable == {"gradients/Shape", "gradients/Shape_1",
                         "gradients/BroadcastGradientArgs", "gradients/Sum",
                         "gradients/Reshape"}


def test_segments_are_not_held_back_by_ops_grappler_folds_away():
    ix = _broadcast_gradient().index()
    regions = analyze_regions(ix)
    triggers = _triggers(ix, regions, {ix.id_of["gradients/use"]})
    assert {ix.names[t] for t in triggers} == {"gradients/dy"}


@pytest.mark.tf
def test_a_keras_resnet_with_checkpoints_in_its_sums_trains_bit_for_bit(tmp_path):
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.tf2_steps import save_residual_step

    src = save_residual_step(tmp_path / "resnet")
    out = tmp_path / "rewritten"
    # the batch norms' outputs, each read only by its block's residual add
    picks = ["batch_normalization_1_2/batchnorm/add_1:0",
             "batch_normalization_3_1/batchnorm/add_1:0"]
    result = rewrite_file(src, out, RewriteOptions("names", picks, 16))
    assert result.plan.checkpoints_to_tree_roots == 2
    assert result.passes["regroup guard"].trees_changed == 0
    run = verify(str(src), str(out), RunSpec(batch_size=16), 3, 0.0, 0.0)  # Grappler on
    assert run.same_training, run.mismatches
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0


def _barrier_rewrite(tmp_path, save, policy: str, batch: int, barriers: bool = True,
                     picks: tuple[str, ...] = ()):
    from unittest import mock

    from graphmem.passes.reader_barriers import ReaderBarriersPass
    from graphmem.rewrite import RewriteOptions, rewrite_file

    src = tmp_path / "src"
    if not src.exists():
        save(src)
    out = tmp_path / ("out" if barriers else "out_without_barriers")
    options = RewriteOptions(policy, list(picks), batch, keep_worse=bool(picks))
    with mock.patch.object(ReaderBarriersPass, "applies", lambda self, context: barriers):
        return src, out, rewrite_file(src, out, options)


def _barred(out) -> list:
    """The ops the rewrite at `out` reads through a barrier."""
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    nodes = {n.name: n for n in Workspace.open(load_model(out)).graph_def.node}
    return [nodes[n.input[0]] for n in nodes.values() if n.name.endswith("/graphmem_barrier")]


def _trains_differently_without_barriers(tmp_path, save, policy: str, batch: int,
                                         picks: tuple[str, ...] = ()) -> None:
    """The rewrite trains bit for bit with Grappler on, and without barriers it does not:
    the test sees the cause."""
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify

    src, out, result = _barrier_rewrite(tmp_path, save, policy, batch, picks=picks)
    assert result.plan.copied_ops > 0 and not result.reverted
    assert result.passes["reader barriers"].barriers > 0
    run = verify(str(src), str(out), RunSpec(batch_size=batch), 3, 0.0, 0.0)  # Grappler on
    assert run.same_training, run.mismatches
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0

    _, out_without, _ = _barrier_rewrite(tmp_path, save, policy, batch, barriers=False,
                                         picks=picks)
    run = verify(str(src), str(out_without), RunSpec(batch_size=batch), 3, 0.0, 0.0)
    assert run.max_loss_diff > 0 or run.max_variable_diff > 0


@pytest.mark.tf
def test_hard_swish_trains_bit_for_bit_with_grappler_on(tmp_path):
    """Keras' hard swish, `x * (relu6(x + 3) / 6)` (MobileNetV3): the division is read by
    the product and by the product's gradient. Once the gradient read a copy, the division
    and its copy were read once each, Grappler folded each into its reader's product (its
    constant folding made the division a product first) and multiplied by 1/6 first: the
    loss differed from the first step with Grappler on (2.4e-7 at batch 4). The division
    is now read through a barrier (its copy, read by the copy of the product too, needs
    none in this plan); the gradient's `(x * g) / 6`, through the
    broadcast gradient's `Sum` and `Reshape`, is a product the regroup guard keeps edges
    off; and copies named after their originals keep the order Grappler sorts a product's
    inputs in by name."""
    from tests.tf2_steps import save_hard_swish_step

    _trains_differently_without_barriers(tmp_path, save_hard_swish_step, "memory", 4)
    barred = _barred(tmp_path / "out")
    assert {n.op for n in barred} <= {"RealDiv", "Mul"}, [n.name for n in barred]
    assert any(n.op == "RealDiv" and not is_copy(n.name) for n in barred)


@pytest.mark.tf
def test_consecutive_residual_adds_train_bit_for_bit_with_grappler_on(tmp_path):
    """Linear bottlenecks (MobileNetV2/V3: no activation after a block's add, so the next
    block's add reads it). The speed policy keeps the convolutions' outputs; a group
    recomputing a block's add copied the add before it too, which the original's next
    block and its gradients also read, and Grappler rebuilt both copies as one sum
    (Keras MobileNetV3Large's speed rewrite summed two blocks' batch norm offsets first:
    momentums 2e-9 apart after two steps). The earlier add's copy is now read through a
    barrier."""
    from tests.tf2_steps import save_linear_residual_step

    _trains_differently_without_barriers(tmp_path, save_linear_residual_step, "speed", 16)
    barred = _barred(tmp_path / "out")
    assert barred and all(is_copy(n.name) and n.op in ("Add", "AddV2") for n in barred)


@pytest.mark.tf
def test_a_product_read_through_a_forwarder_is_barred(tmp_path):
    """Keras' swish hands `x * sigmoid(x)` on through an `IdentityN`, which Grappler
    prunes: in the original, the product's readers are the `IdentityN`'s (the squeeze's
    pooling, the excitation's product, gradients). A plan keeping the squeezes alone
    (`--policy names`) copies the swish in two groups, one of whose copies only the
    excitation's product reads, and Grappler folded it into that product (weights 7e-9
    apart after three steps). Reads are now counted through forwarders."""
    from functools import partial

    from tests.tf2_steps import save_squeeze_excite_step

    save = partial(save_squeeze_excite_step, side=32)
    picks = ("/se_reduce[01][^/]*/BiasAdd:0$",)
    _trains_differently_without_barriers(tmp_path, save, "names", 4, picks)
    barred = _barred(tmp_path / "out")
    assert any(is_copy(n.name) and n.op == "Mul" and "swish" in n.name for n in barred)


@pytest.mark.tf
def test_swish_trains_bit_for_bit_with_grappler_on(tmp_path):
    """Keras' swish (`tf.nn.silu`, EfficientNet's activation): its gradient recomputes
    `sigmoid(x)` under `control_dependencies([dy])`. Copies held back by `dy`'s producer
    made that edge implied, Grappler dropped it and merged the gradient's sigmoid with the
    copy of the forward one; the copy's `x * sigmoid(x)` was then no longer fused into
    `_MklSwish` as the forward product is (oneDNN), and rounded differently (Keras
    EfficientNetV2B0: its first layers' momentums by 4e-8 after one step). No trigger now
    depends on a control input of the copies' readers."""
    from unittest import mock

    import graphmem.passes.recompute as recompute
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.tf2_steps import save_swish_step

    src = save_swish_step(tmp_path / "swish")
    picks = ["/conv1[^/]*/convolution:0$", "/conv2[^/]*/convolution:0$"]

    def rewrite(out, keep_apart=True):
        if keep_apart:
            return rewrite_file(src, out, RewriteOptions("names", picks, 4))
        with mock.patch.object(recompute, "_kept_control_sources", lambda *args: set()):
            return rewrite_file(src, out, RewriteOptions("names", picks, 4))

    result = rewrite(tmp_path / "out")
    assert result.plan.copied_ops > 0 and not result.reverted
    assert not any(t.endswith("Conv2DBackpropInput")
                   for s in result.plan.segments for t in s.triggers)
    run = verify(str(src), str(tmp_path / "out"), RunSpec(batch_size=4), 3, 0.0, 0.0)
    assert run.same_training, run.mismatches
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0

    # held back by the input gradient silu's gradient waits for, it rounds differently:
    # the test sees the cause
    implied = rewrite(tmp_path / "implied", keep_apart=False)
    assert any(t.endswith("/convolution/Conv2DBackpropInput")
               for s in implied.plan.segments for t in s.triggers)
    run = verify(str(src), str(tmp_path / "implied"), RunSpec(batch_size=4), 3, 0.0, 0.0)
    assert run.max_loss_diff > 0 or run.max_variable_diff > 0


@pytest.mark.tf
def test_squeeze_and_excitation_trains_bit_for_bit_with_grappler_on(tmp_path):
    """EfficientNet's squeeze and excitation: the squeeze's `BiasAdd` (a checkpoint) is read
    by `x * sigmoid(x)`, which the oneDNN remapper fuses into `_MklSwish`. A copy of the
    sigmoid held back by a control edge of its own was left unfused, and rounded
    differently (Keras EfficientNetV2B0's speed rewrite); held through an Identity of the
    checkpoint that the product's copy reads too, it is fused as the forward one is."""
    from unittest import mock

    import graphmem.passes.recompute as recompute
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.tf2_steps import save_squeeze_excite_step

    src = save_squeeze_excite_step(tmp_path / "se", side=32)
    options = RewriteOptions("names", ["/swish[01][^/]*/IdentityN:0$",
                                       "/se_reduce[01][^/]*/BiasAdd:0$"], 4, keep_worse=True)
    out = tmp_path / "out"
    result = rewrite_file(src, out, options)
    assert result.plan.copied_ops > 0 and result.plan.held_through_identity > 0
    index = Workspace.open(load_model(out)).index
    assert not any(index.control_inputs[i] for i, n in enumerate(index.names) if is_copy(n))
    run = verify(str(src), str(out), RunSpec(batch_size=4), 3, 0.0, 0.0)  # Grappler on
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0

    # the same plan with the first copies held back by edges of their own: rounds apart
    with mock.patch.object(recompute, "_hold_input", lambda *args: False):
        rewrite_file(src, tmp_path / "edges", options)
    run = verify(str(src), str(tmp_path / "edges"), RunSpec(batch_size=4), 3, 0.0, 0.0)
    assert run.max_loss_diff > 0 or run.max_variable_diff > 0


@pytest.mark.tf
def test_copies_of_a_computed_reshape_keep_the_originals_dimensions(tmp_path):
    """ConvNeXt's block in small, batch unknown: Keras' `Dense` on a 4-D tensor reshapes
    through `Tensordot` to a computed shape. TF's shape inference gave the copy of that
    reshape dimensions of its own, Grappler could not prove a GELU gradient product's
    operands (one from the copies, one from the original) broadcast, and regrouped it in
    the original only: a weight 3e-8 apart after three steps with Grappler on. The copies
    now read the original's result's shape."""
    from unittest import mock

    import graphmem.passes.recompute as recompute
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.tf2_steps import save_pointwise_gelu_step

    src = save_pointwise_gelu_step(tmp_path / "block")
    out = tmp_path / "out"
    result = rewrite_file(src, out, RewriteOptions("speed", [], 8))
    assert result.plan.reshapes_aligned > 0
    index = Workspace.open(load_model(out)).index
    for i, name in enumerate(index.names):
        if is_copy(name) and index.ops[i] == "Reshape" and \
                index.ops[index.data_inputs[i][1][0]] == "Shape":
            shape = index.data_inputs[i][1][0]
            assert index.names[index.data_inputs[shape][0][0]] == original_name(name)
    run = verify(str(src), str(out), RunSpec(batch_size=8), 3, 0.0, 0.0)  # Grappler on
    assert run.max_loss_diff == 0 and run.max_variable_diff == 0

    unaligned = tmp_path / "unaligned"
    with mock.patch.object(recompute, "_align_reshape", lambda *args: 0):
        rewrite_file(src, unaligned, RewriteOptions("speed", [], 8))
    run = verify(str(src), str(unaligned), RunSpec(batch_size=8), 3, 0.0, 0.0)
    assert run.max_loss_diff > 0 or run.max_variable_diff > 0
