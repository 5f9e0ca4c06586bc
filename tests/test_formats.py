"""Every format loads, is detected from its path and bytes, and saves back unchanged."""

import pytest

from graphmem.errors import InputError
from graphmem.formats import Format, load_model, save_model, save_unchanged
from graphmem.formats import save as save_module
from tests.conftest import fixture_path

CASES = [
    ("mlp", Format.META),
    ("mlp_text", Format.META_TEXT),
    ("mlp_pb", Format.GRAPHDEF),
    ("mlp_pbtxt", Format.GRAPHDEF_TEXT),
    ("resnet", Format.META),
    ("lstm_v2", Format.META),
]


@pytest.mark.parametrize("name,fmt", CASES)
def test_round_trip_gives_an_equal_proto(name, fmt, tmp_path):
    model = load_model(fixture_path(name))
    assert model.format == fmt
    out = tmp_path / fixture_path(name).name
    save_model(model, out, rewritten=False)
    again = load_model(out)
    assert again.format == fmt
    assert again.container == model.container
    assert len(again.graph_def.node) == len(model.graph_def.node) > 0


@pytest.mark.parametrize("tag", ["train", "serve"])
def test_tf1_saved_model_round_trip_keeps_every_meta_graph_and_variables(tag, tmp_path):
    model = load_model(fixture_path("tf1_saved_model_train"), tag=tag)
    assert model.tags == (tag,)
    out = tmp_path / "sm"
    save_model(model, out, rewritten=False)
    again = load_model(out, tag=tag)
    assert again.container == model.container
    assert len(again.container.meta_graphs) == 2
    src_vars = sorted(p.name for p in (fixture_path("tf1_saved_model_train") / "variables").iterdir())
    assert sorted(p.name for p in (out / "variables").iterdir()) == src_vars


def test_tf2_saved_model_finds_its_train_step(fixtures, tmp_path):
    model = load_model(fixture_path("tf2_saved_model"))
    assert model.function_name == fixtures["tf2_saved_model"]["function"]
    out = tmp_path / "sm2"
    save_model(model, out, rewritten=False)
    assert load_model(out).container == model.container
    assert (out / "fingerprint.pb").exists()
    save_model(model, tmp_path / "sm3", rewritten=True)
    assert not (tmp_path / "sm3" / "fingerprint.pb").exists()  # it would no longer match


def test_an_unchanged_model_is_written_as_its_input(tmp_path):
    src = fixture_path("mlp_text")  # a text file: re-serializing would not keep its bytes
    save_unchanged(load_model(src), tmp_path / "same.meta")
    assert (tmp_path / "same.meta").read_bytes() == src.read_bytes()
    sm = fixture_path("tf2_saved_model")
    save_unchanged(load_model(sm), tmp_path / "sm")
    assert (tmp_path / "sm" / "saved_model.pb").read_bytes() == \
        (sm / "saved_model.pb").read_bytes()
    assert (tmp_path / "sm" / "fingerprint.pb").read_bytes() == \
        (sm / "fingerprint.pb").read_bytes()  # still the fingerprint of that saved_model.pb


def test_saved_model_tag_errors_list_the_tags():
    with pytest.raises(InputError, match=r"choose one with --tag \(tags: train; serve\)"):
        load_model(fixture_path("tf1_saved_model_train"))
    with pytest.raises(InputError, match="no MetaGraphDef .* tags 'gpu'"):
        load_model(fixture_path("tf1_saved_model_train"), tag="gpu")


def test_unknown_function_lists_training_functions(fixtures):
    with pytest.raises(InputError, match=fixtures["tf2_saved_model"]["function"]):
        load_model(fixture_path("tf2_saved_model"), function="no_such_function")


def test_format_override_and_sniffing(tmp_path):
    text_meta = tmp_path / "model.pbtxt"  # a text MetaGraphDef under a GraphDef-ish name
    text_meta.write_bytes(fixture_path("mlp_text").read_bytes())
    assert load_model(text_meta).format == Format.META_TEXT
    binary_as_meta = tmp_path / "graph.bin"
    binary_as_meta.write_bytes(fixture_path("mlp").read_bytes())
    assert load_model(binary_as_meta, fmt="meta").format == Format.META


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    model = load_model(fixture_path("mlp"))

    def broken(_model):
        raise RuntimeError("disk full")

    monkeypatch.setattr(save_module, "serialize", broken)
    out = tmp_path / "out.meta"
    with pytest.raises(RuntimeError):
        save_model(model, out)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        save_model(load_model(fixture_path("tf2_saved_model")), tmp_path / "sm")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite_input_saved_model():
    model = load_model(fixture_path("tf2_saved_model"))
    with pytest.raises(InputError, match="overwrite the input"):
        save_model(model, fixture_path("tf2_saved_model"))


def test_a_rewrite_writes_the_same_bytes_in_every_process(tmp_path):
    """Protobuf writes map fields (a node's attrs) in an order that changes from one
    process to the next unless asked to be deterministic: the same rewrite must give the
    same file (CI caches and diffs rely on it)."""
    import subprocess
    import sys

    outs = []
    for k in range(2):
        out = tmp_path / f"r{k}.meta"
        subprocess.run([sys.executable, "-m", "graphmem.cli", "rewrite",
                        str(fixture_path("transformer")), "--batch-size", "16", "-o", str(out),
                        "--json"], check=True, capture_output=True)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
