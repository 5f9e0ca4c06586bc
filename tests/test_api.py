"""The library API (graphmem.inspect / rewrite / plan / verify): the same documents as the
CLI's --json, in-memory models, and errors that raise instead of exiting."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import graphmem
from graphmem import protos
from graphmem.errors import CheckFailed, GraphmemError, InputError, UsageError
from graphmem.formats import load_model
from tests.conftest import fixture_path, run_cli

MLP = fixture_path("mlp")


def _cli_json(*args) -> dict:
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _without(doc: dict, *keys) -> dict:
    return {k: v for k, v in doc.items() if k not in keys}


# ------------------------------------------------------------------ same as the CLI

def test_inspect_to_json_is_the_cli_document():
    result = graphmem.inspect(str(MLP), top=5, batch_size=16)
    assert isinstance(result, graphmem.InspectResult)
    assert result.to_json() == _cli_json("inspect", MLP, "--top", "5", "--batch-size", "16")
    assert result.estimated_peak_bytes > 0 and result.to_json()["timeline"] == []


def test_rewrite_to_json_is_the_cli_document(tmp_path):
    api_out, cli_out = tmp_path / "api.meta", tmp_path / "cli.meta"
    result = graphmem.rewrite(str(MLP), str(api_out), policy="speed", batch_size=16)
    assert isinstance(result, graphmem.RewriteResult)
    doc = _cli_json("rewrite", MLP, "-o", cli_out, "--policy", "speed", "--batch-size", "16")
    assert result.to_json() == {**doc, "output": str(api_out)}
    assert result.plan.copied_ops > 0 and result.rewritten is None
    # the same rewrite, the same bytes
    assert api_out.read_bytes() == cli_out.read_bytes()


def test_rewrite_swap_options_as_keywords(tmp_path):
    out = tmp_path / "swap.meta"
    result = graphmem.rewrite(MLP, out, swap=True, swap_threshold="1KiB",
                              swap_max_tensors=2, batch_size=16)
    doc = _cli_json("rewrite", MLP, "-o", tmp_path / "cli.meta", "--swap", "--swap-threshold",
                    "1KiB", "--swap-max-tensors", "2", "--batch-size", "16")
    assert result.choice.policy == "none"  # swap alone: no recompute, as on the CLI
    assert result.to_json() == {**doc, "output": str(out)}
    assert 0 < result.swap.swapped_tensors <= 2


def test_plan_to_json_is_the_cli_document():
    curve = graphmem.plan(MLP, points=4, batch_size=16)
    assert isinstance(curve, graphmem.Tradeoff)
    assert curve.to_json() == _cli_json("plan", MLP, "--points", "4", "--batch-size", "16")
    assert {p.label for p in curve.policies} == {"memory", "speed"}


@pytest.mark.tf
def test_verify_to_json_has_the_cli_document(tmp_path):
    out = tmp_path / "out.meta"
    graphmem.rewrite(MLP, out, batch_size=16)
    result = graphmem.verify(MLP, out, steps=2, exact=True, batch_size=16)
    assert isinstance(result, graphmem.VerifyResult) and result.same_training
    doc = _cli_json("verify", MLP, out, "--steps", "2", "--exact", "--batch-size", "16")
    mine = result.to_json()
    assert mine.keys() == doc.keys()
    # measured peaks and step times change from run to run; training does not
    for key in ("same_training", "max_loss_diff", "max_variable_diff", "variables_compared",
                "rtol", "atol", "mismatches", "batch_size", "batch_from"):
        assert mine[key] == doc[key], key
    assert mine["original"]["losses"] == doc["original"]["losses"]
    assert mine["original"]["path"] == str(MLP)


# ------------------------------------------------------------------ the CLI's behaviour

def test_without_a_batch_size_inspect_counts_and_the_rest_ask_for_it(tmp_path):
    """The MLP's inputs are [?, 16]: inspect still counts, with sizes unknown (the CLI's
    document, peak null); what needs sizes stops with the CLI's usage error, before
    anything is written."""
    facts = graphmem.inspect(MLP)
    assert facts.estimated_peak_bytes is None
    assert facts.to_json()["estimated_peak_bytes"] is None
    assert facts.to_json() == _cli_json("inspect", MLP)
    assert facts.to_json()["saved_activations"]["unknown_size_count"] > 0
    cli = run_cli("rewrite", MLP, "-o", tmp_path / "cli.meta")
    assert cli.exit_code == 2
    calls = [lambda: graphmem.rewrite(MLP, tmp_path / "out.meta"),
             lambda: graphmem.rewrite(MLP),
             lambda: graphmem.plan(MLP, points=3),
             lambda: graphmem.inspect(MLP, plot=tmp_path / "p.svg"),
             lambda: graphmem.inspect(MLP, max_peak="1GiB")]
    for call in calls:
        with pytest.raises(UsageError, match="give it with --batch-size N") as info:
            call()
        assert info.value.exit_code == 2
        assert f"graphmem: error: {info.value}" in cli.stderr
    assert not any(tmp_path.iterdir())


def test_every_stage_is_told_to_on_stage(tmp_path):
    stages = []
    graphmem.rewrite(MLP, tmp_path / "o.meta", batch_size=8, plot=tmp_path / "o.svg",
                     on_stage=stages.append)
    assert stages == ["reading the model", "rewriting", "writing the output",
                      "drawing the plot"]
    stages.clear()
    graphmem.rewrite(MLP, batch_size=8, on_stage=stages.append)  # nothing written
    assert stages == ["reading the model", "rewriting"]
    stages.clear()
    graphmem.inspect(MLP, on_stage=stages.append)
    assert stages == ["reading the model", "analysing"]
    stages.clear()
    graphmem.plan(MLP, batch_size=8, points=2, on_stage=stages.append)
    assert stages[0] == "reading the model" and "rewriting with the speed policy" in stages


def test_tag_set_and_its_alias_tag():
    saved = fixture_path("tf1_saved_model_train")
    by_tag_set = graphmem.inspect(saved, tag_set="train", batch_size=4).to_json()
    assert by_tag_set == graphmem.inspect(saved, tag="train", batch_size=4).to_json()
    assert by_tag_set == _cli_json("inspect", saved, "--tag-set", "train", "--batch-size", "4")
    with pytest.raises(UsageError, match="--tag-set and --tag"):
        graphmem.inspect(saved, tag_set="train", tag="serve")


@pytest.mark.parametrize("call, match", [
    # the CLI's checks of option values (graphmem/options.py), with --swap off too
    (lambda o: graphmem.rewrite(MLP, o, swap_include="(", batch_size=8), "--swap-include"),
    (lambda o: graphmem.rewrite(MLP, o, swap=True, swap_start="[", batch_size=8),
     "--swap-start"),
    (lambda o: graphmem.rewrite(MLP, o, backward_scope=["grad(", "x"]), "--backward-scope"),
    (lambda o: graphmem.rewrite(MLP, o, batch_size=2**31), "--batch-size"),
    (lambda o: graphmem.rewrite(MLP, o, budget=float("nan")), "--budget"),
    (lambda o: graphmem.rewrite(MLP, o, swap=True, swap_in_ahead="1:²"), "--swap-in-ahead"),
    (lambda o: graphmem.rewrite(MLP, o, plot=o.parent / "p.pdf"), "--plot"),
    (lambda o: graphmem.rewrite(MLP, o.parent / "a.svg", plot=o.parent / "a.svg"),
     "another output"),
    (lambda o: graphmem.rewrite(MLP, MLP), "input model"),
    (lambda o: graphmem.verify(MLP, o, rtol=float("inf")), "--rtol"),
    (lambda o: graphmem.verify(MLP, o, seed=-1), "--seed"),
])
def test_the_cli_option_checks_apply(tmp_path, call, match):
    out = tmp_path / "out.meta"
    with pytest.raises(GraphmemError, match=match) as info:
        call(out)
    assert info.value.exit_code == 2
    assert not any(tmp_path.rglob("*"))


# ------------------------------------------------------------------ in-memory models

def _graph_def_from(path) -> object:
    return load_model(path).container


def test_in_memory_graphdef_inspects_like_its_file():
    graph = _graph_def_from(fixture_path("mlp_pb"))
    from_memory = graphmem.inspect(graph).to_json()
    from_file = graphmem.inspect(fixture_path("mlp_pb")).to_json()
    assert from_memory["model"]["path"] == "<in-memory GraphDef>"
    assert _without(from_memory, "model") == _without(from_file, "model")


@pytest.mark.tf
def test_tensorflow_messages_are_accepted_and_returned_in_their_class():
    import tensorflow as tf

    meta = tf.compat.v1.MetaGraphDef.FromString(MLP.read_bytes())
    before = meta.SerializeToString()
    result = graphmem.rewrite(meta, batch_size=16)
    assert isinstance(result.rewritten, tf.compat.v1.MetaGraphDef)
    assert meta.SerializeToString() == before  # the caller's message is not edited
    names = {n.name for n in result.rewritten.graph_def.node}
    assert len(names) == result.nodes_after > len(meta.graph_def.node)
    # the returned message imports and is what the CLI writes for the file
    file_result = graphmem.rewrite(MLP, batch_size=16)
    assert file_result.rewritten.SerializeToString(deterministic=True) == \
        protos.MetaGraphDef().FromString(result.rewritten.SerializeToString()) \
        .SerializeToString(deterministic=True)
    with tf.Graph().as_default():
        tf.compat.v1.train.import_meta_graph(result.rewritten)


def test_in_memory_rewrite_writes_the_format_its_output_names(tmp_path):
    graph = _graph_def_from(fixture_path("mlp_pb"))
    binary, text = tmp_path / "out.pb", tmp_path / "out.pbtxt"
    a = graphmem.rewrite(graph, binary, batch_size=16)
    b = graphmem.rewrite(graph, text, batch_size=16)
    assert b.nodes_after == a.nodes_after
    assert a.rewritten is None and a.output == str(binary)
    loaded_a, loaded_b = load_model(binary), load_model(text)
    assert loaded_a.format.value == "graphdef" and loaded_b.format.value == "graphdef_text"
    assert len(loaded_a.graph_def.node) == a.nodes_after == len(loaded_b.graph_def.node)


def test_in_memory_plan_matches_the_file():
    meta = _graph_def_from(MLP)
    assert graphmem.plan(meta, points=3, batch_size=16).to_json() == \
        graphmem.plan(MLP, points=3, batch_size=16).to_json()


# ------------------------------------------------------------------ errors

def test_bad_models_raise_input_errors(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        graphmem.inspect(tmp_path / "missing.meta")
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(b"\xff\x00not a graph")
    with pytest.raises(InputError) as info:
        graphmem.rewrite(garbage, tmp_path / "out.pb")
    assert info.value.exit_code == 2
    with pytest.raises(InputError, match="GraphDef or a MetaGraphDef"):
        graphmem.inspect(42)
    with pytest.raises(InputError, match="GraphDef or a MetaGraphDef"):
        graphmem.inspect(protos.NodeDef())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.pb"]  # nothing written


@pytest.mark.parametrize("call, match", [
    (lambda o: graphmem.rewrite(MLP, o, policy="fastest"), "--policy"),
    (lambda o: graphmem.rewrite(MLP, o, batch_size=0), "--batch-size"),
    (lambda o: graphmem.rewrite(MLP, o, batch_size="8"), "--batch-size"),
    (lambda o: graphmem.rewrite(MLP, o, format="onnx"), "--format"),
    (lambda o: graphmem.rewrite(MLP, o, swap=True, swap_in_ahead="10:1"), "--swap-in-ahead"),
    (lambda o: graphmem.rewrite(MLP, o, swap=True, swap_threshold="lots"), "size"),
    (lambda o: graphmem.rewrite(MLP, o, max_peak="1 parsec"), "size"),
    (lambda o: graphmem.rewrite(MLP, o, budget="0.5", policy="memory"), "--budget"),
    (lambda o: graphmem.rewrite(MLP, o, policy="budget"), "--budget"),
    (lambda o: graphmem.rewrite(MLP, o, budget="-3"), "--budget"),
    (lambda o: graphmem.rewrite(MLP, o, checkpoints=[1, 2]), "--checkpoints"),
    (lambda o: graphmem.rewrite(MLP, o, keep_worse="yes"), "--keep-worse"),
    (lambda o: graphmem.rewrite(MLP, o, plot=o.parent / "nope" / "p.svg"), "--plot"),
    (lambda o: graphmem.rewrite(MLP, o.parent / "nope" / "out.meta"), "does not exist"),
    (lambda o: graphmem.inspect(MLP, top=-1), "--top"),
    (lambda o: graphmem.plan(MLP, points=1), "--points"),
    (lambda o: graphmem.verify(MLP, o, steps=0), "--steps"),
    (lambda o: graphmem.verify(MLP, o, feed=["x"]), "--feed"),
])
def test_bad_option_values_raise_usage_errors_and_write_nothing(tmp_path, call, match):
    out = tmp_path / "out.meta"
    with pytest.raises(GraphmemError, match=match) as info:
        call(out)
    assert info.value.exit_code == 2
    assert not any(tmp_path.rglob("*"))


def test_unknown_keyword_is_a_type_error(tmp_path):
    with pytest.raises(TypeError, match="swap_treshold"):
        graphmem.rewrite(MLP, tmp_path / "o.meta", swap=True, swap_treshold="1KiB")
    assert not any(tmp_path.iterdir())


def test_max_peak_gate_raises_check_failed_or_waits_for_check(tmp_path):
    with pytest.raises(CheckFailed, match="above the limit") as info:
        graphmem.inspect(MLP, max_peak=1, batch_size=16)
    assert info.value.exit_code == 1
    result = graphmem.inspect(MLP, max_peak="1KiB", batch_size=16, check=False)
    with pytest.raises(CheckFailed):
        result.check()
    graphmem.inspect(MLP, max_peak="10GiB", batch_size=16)  # under the limit: no error
    out = tmp_path / "out.meta"
    with pytest.raises(CheckFailed, match="after the rewrite"):
        graphmem.rewrite(MLP, out, max_peak=1, batch_size=16)
    assert out.exists()  # as the CLI: written, then exit 1


def test_format_and_tag_are_for_files():
    with pytest.raises(UsageError, match="in-memory"):
        graphmem.inspect(_graph_def_from(MLP), format="meta")


# ------------------------------------------------------------------ the package

def test_importing_graphmem_loads_no_tensorflow_rich_or_analyses():
    code = ("import sys, graphmem; graphmem.GraphmemError; graphmem.__version__; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'rich', 'numpy', 'click') or m.startswith('graphmem.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1])
    assert out.stdout.strip() == "['graphmem.errors']"


def test_rewrite_and_plan_are_functions_and_still_their_modules():
    import graphmem.rewrite as rw
    from graphmem.rewrite import RewriteOptions

    assert graphmem.rewrite.RewriteOptions is RewriteOptions
    assert rw.rewrite_workspace is graphmem.rewrite.rewrite_workspace
    assert graphmem.plan.tradeoff.__module__ == "graphmem.plan"
    assert "model" in __import__("inspect").signature(graphmem.rewrite).parameters
    assert graphmem.rewrite.__doc__.startswith("Rewrite a training graph")
    assert callable(graphmem.inspect) and callable(graphmem.verify)


def test_patching_the_driver_module_through_the_command_is_undone_cleanly():
    """Monkeypatching `graphmem.rewrite.X` (as tests and users do) and undoing it leaves the
    driver module's attribute as it was: pytest 9.2 restores from the object's `__dict__`,
    and read from an empty proxy that undo deleted the module's attribute."""
    import sys

    import graphmem.rewrite as rw

    module = sys.modules["graphmem.rewrite"]
    before = module.MEMORY_SEARCH_NODES
    patch = pytest.MonkeyPatch()
    patch.setattr(rw, "MEMORY_SEARCH_NODES", 0)
    assert module.MEMORY_SEARCH_NODES == 0
    patch.undo()
    assert module.MEMORY_SEARCH_NODES == before
    assert vars(rw) is vars(module)


@pytest.mark.tf
def test_verify_in_memory_models():
    meta = _graph_def_from(MLP)
    rewritten = graphmem.rewrite(meta, batch_size=16).rewritten
    result = graphmem.verify(meta, rewritten, steps=2, exact=True, batch_size=16)
    assert result.same_training and result.max_variable_diff == 0
    assert result.variables_compared > 0
    assert result.to_json()["original"]["path"] == "<in-memory MetaGraphDef>"


@pytest.mark.tf
def test_verify_differing_training_raises_check_failed(tmp_path):
    """A rewritten graph that trains differently (another learning rate): exit 1 as an
    exception, with the result kept for check=False."""
    import tensorflow as tf

    other = tf.compat.v1.MetaGraphDef.FromString(MLP.read_bytes())
    changed = 0
    for node in other.graph_def.node:
        if node.op == "Const" and node.name.endswith("learning_rate"):
            node.attr["value"].tensor.float_val[:] = [0.5]
            changed += 1
    assert changed == 1
    with pytest.raises(CheckFailed, match="training differs") as info:
        graphmem.verify(MLP, other, steps=2, batch_size=16)
    assert info.value.exit_code == 1
    result = graphmem.verify(MLP, other, steps=2, batch_size=16, check=False)
    assert not result.same_training and result.mismatches
