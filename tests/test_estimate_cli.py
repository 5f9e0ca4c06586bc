"""The estimate's user surface: plots, the --max-peak gate, sizes, --grappler."""

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.conftest import fixture_path, run_cli


def test_inspect_plot_svg_is_valid_and_marks_the_peak(tmp_path):
    out = tmp_path / "mem.svg"
    res = run_cli("inspect", fixture_path("mlp"), "--batch-size", "32", "--plot", out)
    assert res.exit_code == 0, res.stderr
    root = ET.fromstring(out.read_text())
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == ns + "svg"
    assert len(root.findall(f"{ns}polyline")) == 1
    assert len(root.findall(f"{ns}circle")) == 1  # the peak marker
    assert any("peak" in (t.text or "") for t in root.findall(f"{ns}text"))


def test_rewrite_plot_png_draws_both_graphs(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "mem.png"
    res = run_cli("rewrite", fixture_path("mlp"), "-o", tmp_path / "o.meta", "--batch-size",
                  "32", "--plot", out)
    assert res.exit_code == 0, res.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_rejects_other_suffixes(tmp_path):
    res = run_cli("inspect", fixture_path("mlp"), "--batch-size", "8", "--plot", tmp_path / "a.jpg")
    assert res.exit_code == 2 and ".svg or .png" in res.stderr
    assert not (tmp_path / "a.jpg").exists()


def test_max_peak_gate(tmp_path):
    doc = json.loads(run_cli("inspect", fixture_path("resnet"), "--batch-size", "16",
                             "--json").stdout)
    peak = doc["estimated_peak_bytes"]
    ok = run_cli("inspect", fixture_path("resnet"), "--batch-size", "16", "--max-peak",
                 str(peak + 1))
    assert ok.exit_code == 0
    over = run_cli("inspect", fixture_path("resnet"), "--batch-size", "16", "--max-peak",
                   str(peak - 1))
    assert over.exit_code == 1 and "above the limit" in over.stderr
    # rewrite: the gate applies to the peak after the rewrite, and the output is written
    out = tmp_path / "r.meta"
    res = run_cli("rewrite", fixture_path("resnet"), "-o", out, "--batch-size", "16",
                  "--max-peak", str(peak - 1), "--json")
    after = json.loads(res.stdout)["after"]["estimated_peak_bytes"]
    assert after < peak - 1 and res.exit_code == 0 and out.exists()
    res = run_cli("rewrite", fixture_path("resnet"), "-o", out, "--batch-size", "16",
                  "--max-peak", "1KiB")
    assert res.exit_code == 1


@pytest.mark.parametrize("bad", ["lots", "12 parsecs", "-1MB", "1..5GB"])
def test_malformed_sizes_exit_2(bad, tmp_path):
    res = run_cli("inspect", fixture_path("mlp"), "--max-peak", bad)
    assert res.exit_code == 2 and "cannot read size" in res.stderr
    res = run_cli("rewrite", fixture_path("mlp"), "-o", tmp_path / "x.meta", "--max-peak", bad)
    assert res.exit_code == 2 and not (tmp_path / "x.meta").exists()


def test_grappler_estimate_sees_fusion(tmp_path):
    plain = json.loads(run_cli("inspect", fixture_path("resnet"), "--batch-size", "16",
                               "--json").stdout)
    fused = json.loads(run_cli("inspect", fixture_path("resnet"), "--batch-size", "16",
                               "--json", "--grappler").stdout)
    assert fused["estimated_on"] == "grappler"
    # Grappler removes buffers (fused conv+bias, pruned ops): never more than the raw graph
    assert 0 < fused["estimated_peak_bytes"] <= plain["estimated_peak_bytes"]


def test_a_rewrite_that_raises_the_estimate_is_undone(tmp_path):
    from graphmem.formats import load_model
    from graphmem.rewrite import RewriteOptions, rewrite_file

    # with no recompute policy, the v1 LSTM fixture's rewrite is the schedule passes alone:
    # the extra Identity that holds each loop sum's term back is estimated to free nothing
    # at the highest of the executor's orders (the estimate runs one iteration of the
    # loop), and a rewrite is kept only when that peak is lower
    src = fixture_path("lstm_v1")
    result = rewrite_file(src, tmp_path / "a.meta", RewriteOptions("none", [], 64))
    assert result.after.peak_bytes >= result.before.peak_bytes
    assert result.reverted
    assert load_model(tmp_path / "a.meta").container == load_model(src).container
    assert (tmp_path / "a.meta").read_bytes() == Path(src).read_bytes()  # the input itself
    kept = rewrite_file(src, tmp_path / "b.meta", RewriteOptions("none", [], 64,
                                                                 keep_worse=True))
    assert not kept.reverted
    assert load_model(tmp_path / "b.meta").container != load_model(src).container
