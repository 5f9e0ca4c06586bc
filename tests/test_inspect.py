"""`graphmem inspect` reports numbers a user can check by hand."""

import json

import pytest

from tests.conftest import DATA, fixture_path, run_cli


def _inspect_json(*args):
    result = run_cli("inspect", *args, "--json", "--top", "200")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_mlp_saved_activations_match_the_hand_count(fixtures):
    f = fixtures["mlp"]["facts"]
    batch = 32
    doc = _inspect_json(fixture_path("mlp"), "--batch-size", batch)
    sa = doc["saved_activations"]
    relu = batch * f["width"] * 4
    expected = {f"layer_{i:02d}/Relu:0": relu for i in range(f["layers"])}
    expected["x:0"] = batch * f["in"] * 4  # read by the first layer's weight gradient
    expected["sparse_softmax_cross_entropy_loss/xentropy/xentropy:1"] = batch * f["classes"] * 4
    expected["sparse_softmax_cross_entropy_loss/xentropy/xentropy:0"] = batch * 4
    expected["sparse_softmax_cross_entropy_loss/Sum_1:0"] = 4
    expected["sparse_softmax_cross_entropy_loss/num_present:0"] = 4
    got = {t["name"]: t["bytes"] for t in sa["largest"]}
    assert got == expected
    assert sa["count"] == len(expected)
    assert sa["total_bytes"] == sum(expected.values())
    assert sa["unknown_size_count"] == 0


def test_mlp_variables_and_regions(fixtures):
    f = fixtures["mlp"]["facts"]
    doc = _inspect_json(fixture_path("mlp"), "--batch-size", "32")
    w = f["width"]
    params = f["in"] * w + (f["layers"] - 1) * w * w + w * f["classes"] \
        + f["layers"] * w + f["classes"]
    # Adam keeps two slots per parameter, plus beta1_power and beta2_power
    assert doc["variables"]["total_bytes"] == (3 * params + 2) * 4
    assert doc["variables"]["count"] == 3 * (2 * f["layers"] + 2) + 2
    assert doc["persistent_bytes"] == doc["variables"]["total_bytes"]
    assert doc["loss"] == [fixtures["mlp"]["loss"]]
    assert doc["regions"]["backward"] > 0 and doc["regions"]["forward"] > 0
    assert doc["nodes"] == fixtures["mlp"]["num_nodes"]
    assert doc["estimated_peak_bytes"] > doc["saved_activations"]["total_bytes"] * 0.5


def test_unknown_batch_is_counted_and_named():
    # without --batch-size, counts are still there; sizes and the peak are not guessed
    doc = _inspect_json(fixture_path("mlp"))
    sa = doc["saved_activations"]
    assert sa["unknown_size_count"] == sa["count"] - 2 == 27  # all but the two scalars
    assert "layer_00/Relu:0" in sa["unknown_size"]
    assert sa["total_bytes"] is None
    assert doc["estimated_peak_bytes"] is None and doc["peak"] is None
    assert "--batch-size" in doc["sizes_unknown"] and "x:0" in doc["sizes_unknown"]
    assert doc["batch_from"] == "unknown"


def test_graphdef_without_shapes_uses_tensorflow_inference():
    a = _inspect_json(fixture_path("mlp_pb"), "--batch-size", "16")
    b = _inspect_json(fixture_path("mlp"), "--batch-size", "16")
    assert a["shapes_from"] == "tensorflow" and b["shapes_from"] == "graph"
    assert a["saved_activations"]["total_bytes"] == b["saved_activations"]["total_bytes"]


def test_control_flow_is_reported():
    v1 = _inspect_json(fixture_path("lstm_v1"), "--batch-size", "8")
    assert v1["control_flow"]["v1_frames"] and not v1["control_flow"]["v2_ops"]
    v2 = _inspect_json(fixture_path("lstm_v2"), "--batch-size", "8")
    assert set(v2["control_flow"]["v2_ops"]) and not v2["control_flow"]["v1_frames"]
    for doc in (v1, v2):
        assert any(u["what"] == "control-flow ops" for u in doc["untouched"])


def test_tf2_train_step_function(fixtures):
    doc = _inspect_json(DATA / "tf2_saved_model", "--batch-size", "8")
    assert doc["model"]["function"] == fixtures["tf2_saved_model"]["function"]
    assert doc["regions"]["backward"] > 0
    assert doc["saved_activations"]["count"] > 0


def test_rich_report_names_the_numbers():
    result = run_cli("inspect", fixture_path("resnet"), "--batch-size", "8")
    assert result.exit_code == 0
    out = result.stdout
    assert "saved activations:" in out and "estimated step peak" in out
    assert "FusedBatchNormV3" in out or "Conv2D" in out


@pytest.mark.parametrize("name", ["resnet", "transformer", "lstm_v1", "lstm_v2"])
def test_every_fixture_has_a_loss_and_saved_activations(name, fixtures):
    doc = _inspect_json(fixture_path(name), "--batch-size", "4")
    assert doc["loss"] == [fixtures[name]["loss"]]
    assert doc["saved_activations"]["total_bytes"] > 0


def test_inspect_of_a_meta_graph_does_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys\nfrom click.testing import CliRunner\nfrom graphmem.cli import main\n"
            f"r = CliRunner().invoke(main, ['inspect', {str(fixture_path('mlp'))!r}, "
            "'--batch-size', '32', '--json'])\n"
            "assert r.exit_code == 0, r.output\nprint('tensorflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
