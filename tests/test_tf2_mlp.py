"""A deep Keras MLP saved as a TF2 train step (GradientTape + Keras Adam), the model of
benchmarks/realworld_bench.py at test size: every rewrite of its train-step function trains
bit for bit like the original."""

import pytest

from benchmarks.realworld_bench import build_tf2_mlp
from graphmem.formats import load_model
from graphmem.passes.recompute import COPY_SCOPE
from graphmem.passes.swap import SWAP_SCOPE, SwapOptions
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify

pytestmark = pytest.mark.tf

FACTS = {"layers": 10, "width": 64, "in": 32, "classes": 10}
BATCH = 16


@pytest.fixture(scope="module")
def deep_mlp(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf2_mlp") / "original"
    build_tf2_mlp(path, FACTS)
    return path


@pytest.mark.parametrize("variant", ["memory", "speed", "swap"])
def test_rewritten_train_step_trains_identically(deep_mlp, tmp_path, variant):
    out = tmp_path / variant
    options = RewriteOptions("none", [], BATCH, swap=SwapOptions()) if variant == "swap" \
        else RewriteOptions(variant, [], BATCH)
    result = rewrite_file(deep_mlp, out, options)
    assert result.model.function_name.startswith("__inference_train_step")
    names = [n.name for n in load_model(out).function.node_def]  # the rewritten train step
    if variant == "swap":
        pairs = result.swap.pairs
        assert result.swap.swapped_tensors >= FACTS["layers"]
        moved = {p.swap_out for p in pairs} | {p.swap_in for p in pairs}
        assert {n for n in names if n.startswith(SWAP_SCOPE + "/")} == moved
    else:
        assert result.plan.copied_ops > 0
        assert sum(n.startswith(COPY_SCOPE + "/") for n in names) == result.plan.copied_ops
    r = verify(str(deep_mlp), str(out), RunSpec(batch_size=BATCH, grappler=False), 3, 0.0, 0.0)
    assert r.same_training, r.mismatches
    assert r.max_loss_diff == 0 and r.max_variable_diff == 0
    # every layer's kernel and bias, Adam's two slots for each, and the iteration count
    assert r.variables_compared >= 3 * 2 * (FACTS["layers"] + 1)
    assert len(set(s.loss for s in r.original.steps)) == 3  # it does train
