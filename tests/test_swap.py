"""The swap pass: structure of every swap pair, and training identical on CPU."""

import json

import pytest

from graphmem.analysis.arithmetic_groups import inner_roots, regrouped_trees
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.passes.swap import KEEP_ATTR, SWAP_SCOPE, SwapOptions
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify
from tests.conftest import fixture_path, run_cli


def _swap(name, tmp_path, policy="none", **kw):
    src = fixture_path(name)
    out = tmp_path / (src.name if src.is_dir() else f"out{src.suffix}")
    options = RewriteOptions(policy, [], 64, swap=SwapOptions(**kw))
    return src, out, rewrite_file(src, out, options)


def _check_pairs(out, result, ahead=(1, 10), src=None):
    ix = Workspace.open(load_model(out)).index
    plan = result.swap
    assert plan.pairs
    # a trigger inside a product Grappler rebuilds has its edge moved to the product's
    # root by the regroup guard (an edge on an inner op would change its rounding)
    roots = {} if src is None else \
        inner_roots(regrouped_trees(Workspace.open(load_model(src)).index))
    for p in plan.pairs:
        o, i = ix.id_of[p.swap_out], ix.id_of[p.swap_in]
        out_node, in_node = ix.node(o), ix.node(i)
        # swap-out reads the tensor and waits on the host; swap-in reads the swap-out
        assert out_node.op == in_node.op == "Identity"
        assert out_node.input[0] == p.tensor.removesuffix(":0")
        assert out_node.device == "/device:CPU:0"
        assert list(in_node.input)[0] == p.swap_out
        assert out_node.attr[KEEP_ATTR].b and in_node.attr[KEEP_ATTR].b
        # exactly the intended control dependency: its trigger, an ancestor of its readers
        controls = [x[1:] for x in in_node.input if x.startswith("^")]
        inner = ix.id_of[p.trigger]
        assert controls == [p.trigger] or inner in roots and \
            controls == [ix.names[roots[inner]]], (controls, p.trigger)
        # the chain rule keeps within the bounds; direct order comes as close as it can
        if p.how == "chain rule":
            assert ahead[0] <= p.distance <= ahead[1]
        else:
            assert p.how == "direct order" and 1 <= p.distance <= ahead[1]
        trigger = ix.id_of[p.trigger]
        for r in p.readers:
            reader = ix.id_of[r]
            assert trigger in ix.ancestors([reader])
            assert p.swap_in in [x for x in ix.node(reader).input]
    return ix


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer"])
def test_swap_trains_identically(name, tmp_path):
    src, out, result = _swap(name, tmp_path)
    _check_pairs(out, result, src=src)
    r = verify(str(src), str(out), RunSpec(batch_size=16, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0
    # on the device being saved, the estimate drops; the swapped bytes wait on the host
    assert result.after.peak_bytes < result.before.peak_bytes
    assert result.after.host_peak_bytes > 0


def test_no_backward_reader_reads_a_swapped_tensor_directly(tmp_path):
    src, out, result = _swap("mlp", tmp_path)
    ix = Workspace.open(load_model(out)).index
    for p in result.swap.pairs:
        t = ix.tensor(p.tensor)
        readers = {ix.names[c] for c in ix.consumers.get(t, ())}
        assert not readers & set(p.readers)
        assert any(r.startswith(f"{SWAP_SCOPE}/") for r in readers)


def test_fused_swap_in_serves_all_readers(tmp_path):
    src, out, result = _swap("mlp", tmp_path, fuse=True)
    by_tensor = {}
    for p in result.swap.pairs:
        by_tensor.setdefault(p.tensor, []).append(p)
    assert all(len(v) == 1 for v in by_tensor.values())
    assert any(len(v[0].readers) > 1 for v in by_tensor.values())
    _check_pairs(out, result)
    unfused = _swap("mlp", tmp_path / "u", fuse=False)[2]
    assert len(unfused.swap.pairs) > len(result.swap.pairs)


def test_trigger_distance_bounds(tmp_path):
    src, out, result = _swap("mlp", tmp_path, ahead=(3, 6))
    chain = [p for p in result.swap.pairs if p.how == "chain rule"]
    assert chain and all(3 <= p.distance <= 6 for p in chain)
    _check_pairs(out, result, ahead=(3, 6))


def test_threshold_max_and_filters(tmp_path):
    big = _swap("resnet", tmp_path / "a", threshold=1 << 20)[2]  # 1 MiB at batch 64
    assert big.swap.pairs and all(p.bytes >= 1 << 20 for p in big.swap.pairs)
    assert big.swap.skipped.get("below --swap-threshold", 0) > 0
    capped = _swap("resnet", tmp_path / "b", max_tensors=3)[2]
    assert capped.swap.swapped_tensors == 3
    only = _swap("resnet", tmp_path / "c", include=["Relu"])[2]
    assert all("Relu" in p.tensor for p in only.swap.pairs)
    none = _swap("resnet", tmp_path / "d", exclude=["."])[2]
    assert not none.swap.pairs


def test_devices_are_as_asked(tmp_path):
    src, out, result = _swap("mlp", tmp_path, device="/device:GPU:0", host="/device:CPU:1")
    ix = Workspace.open(load_model(out)).index
    for p in result.swap.pairs:
        assert ix.node(ix.id_of[p.swap_out]).device == "/device:CPU:1"
        assert ix.node(ix.id_of[p.swap_in]).device == "/device:GPU:0"


def test_hybrid_swaps_the_checkpoints(tmp_path):
    src, out, result = _swap("mlp", tmp_path, policy="memory")
    kept = {c.name for c in result.checkpoints}
    assert kept and {p.tensor for p in result.swap.pairs} == kept
    r = verify(str(src), str(out), RunSpec(batch_size=16, grappler=False), 3, 0.0, 0.0)
    assert r.same_training


def test_swap_cli_json_and_bad_ahead(tmp_path):
    out = tmp_path / "o.meta"
    res = run_cli("rewrite", fixture_path("mlp"), "-o", out, "--swap", "--batch-size", "256",
                  "--swap-threshold", "64KiB", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["policy"] == "none" and doc["swap"]["swapped_tensors"] > 0
    assert doc["after"]["estimated_peak_bytes"] < doc["before"]["estimated_peak_bytes"]
    assert doc["after"]["host_peak_bytes"] > 0
    pair = doc["swap"]["pairs"][0]
    assert {"tensor", "bytes", "swap_out", "swap_in", "trigger", "distance"} <= set(pair)
    bad = run_cli("rewrite", fixture_path("mlp"), "-o", tmp_path / "b.meta", "--swap",
                  "--swap-in-ahead", "5:2", "--batch-size", "8")
    assert bad.exit_code == 2 and "--swap-in-ahead" in bad.stderr
    bad = run_cli("rewrite", fixture_path("mlp"), "-o", tmp_path / "b.meta", "--swap",
                  "--swap-start", "no_such_scope", "--batch-size", "8")
    assert bad.exit_code == 2 and "--swap-start" in bad.stderr
