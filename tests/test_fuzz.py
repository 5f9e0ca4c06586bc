"""Generated hostile input (Hypothesis): whatever the bytes, text, graph structure or option
values, graphmem answers with a result or one `graphmem: error:` line and exit 2: never a
traceback, an internal error (exit 3) or an output left behind; and the compiled reader
agrees with the pure-Python one on every graph, errors included.

Deterministic and small (a fixed derandomized profile, no example database) so the suite
stays fast; benchmarks/fuzz_bench.py runs thousands of inputs in separate processes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from graphmem import protos
from graphmem.errors import InputError
from graphmem.formats import load_model
from graphmem.graph import index as index_module
from graphmem.graph.opdef_check import check_graph
from graphmem.graph.opdefs import OpRegistry
from graphmem.native import native
from tests.conftest import DATA, run_cli

FUZZ = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


def fuzz(examples: int) -> settings:
    return settings(FUZZ, max_examples=examples)

MLP = DATA / "mlp.meta"
MLP_BYTES = MLP.read_bytes()
ODD_INDICES = ["²", "0١", "𝟘", "0000000001", "999999999", "1" + "0" * 30, "", "01", "٣",
               " 1", "-1"]


def _assert_clean(result, output=None):
    """Exit 0 or 1 (a result), or exit 2 with one error line and nothing written."""
    event(f"exit {result.exit_code}")
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("graphmem: error: "), result.stderr
        if output is not None:
            assert not output.exists(), "a failed run left its output"
            assert not [p for p in output.parent.iterdir()
                        if p.name.startswith(f".{output.name}.")], "a temporary file was left"


@st.composite
def byte_edits(draw):
    """Bytes of the MLP fixture with a few flipped, inserted or deleted, or cut short."""
    data = bytearray(MLP_BYTES)
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data) - 1))
        how = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if how == "flip":
            data[at] = draw(st.integers(0, 255))
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del data[at:at + draw(st.integers(1, 64))]
        else:
            del data[at:]
        if not data:
            break
    return bytes(data)


@fuzz(25)
@given(data=byte_edits())
def test_mutated_bytes_give_a_result_or_one_error_line(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("bytes") / "model.meta"
    path.write_bytes(data)
    _assert_clean(run_cli("inspect", path, "--json"))


TEXT_MODEL = None


def _text_model() -> str:
    """A small text GraphDef: the MLP fixture's first nodes (text parsing is slow in pure
    Python; the mutations, not the size, are the point)."""
    global TEXT_MODEL
    if TEXT_MODEL is None:
        meta = load_model(MLP).meta_graph
        graph = protos.GraphDef()
        graph.node.extend(meta.graph_def.node[:60])
        graph.versions.CopyFrom(meta.graph_def.versions)
        TEXT_MODEL = protos.to_text(graph)
    return TEXT_MODEL


@fuzz(20)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(
    ["", "{", "}", '"', "\\", ":", "x: 1", "\x00", "é", "DT_STRING", "DT_BOGUS", "-1",
     "99999999999999999999", "node {", "op: \"NoSuchOp\"", "input: \"x:²\""])),
    min_size=1, max_size=3))
def test_mutated_text_gives_a_result_or_one_error_line(edits, tmp_path_factory):
    text = _text_model()
    for at, piece in edits:
        at %= len(text)
        text = text[:at] + piece + text[at + len(piece) // 2:]
    path = tmp_path_factory.mktemp("text") / "model.pbtxt"
    path.write_text(text, encoding="utf-8")
    # the slice holds no gradients: its last layer stands in for a backward pass, so the
    # analyses past the reader run too
    _assert_clean(run_cli("inspect", path, "--json", "--backward-scope", "layer_02/"))


# ---- structural edits through the protos ---------------------------------------------

EDITS = ["op", "drop attr", "attr kind", "dtype", "rewire", "odd index", "drop input",
         "add input", "duplicate", "huge dim", "name"]


@st.composite
def graph_edits(draw):
    meta = protos.MetaGraphDef()
    meta.ParseFromString(MLP_BYTES)
    nodes = meta.graph_def.node
    ops = sorted({n.op for n in nodes})
    for _ in range(draw(st.integers(1, 2))):
        node = nodes[draw(st.integers(0, len(nodes) - 1))]
        edit = draw(st.sampled_from(EDITS))
        keys = sorted(node.attr)
        if edit == "op":
            node.op = draw(st.sampled_from([*ops, "NoSuchOp", ""]))
        elif edit == "drop attr" and keys:
            del node.attr[draw(st.sampled_from(keys))]
        elif edit == "attr kind" and keys:
            value = node.attr[draw(st.sampled_from(keys))]
            value.Clear()
            kind = draw(st.sampled_from(["s", "i", "f", "b", "type"]))
            setattr(value, kind, draw({"s": st.binary(max_size=4),
                                       "i": st.integers(-2**63, 2**63 - 1),
                                       "f": st.floats(),
                                       "b": st.booleans(),
                                       "type": st.integers(0, 2**31 - 1)}[kind]))
        elif edit == "dtype":
            key = next((k for k in ("T", "dtype", "DstT") if k in node.attr), None)
            if key:
                node.attr[key].type = draw(st.sampled_from([1, 2, 3, 7, 9, 20, 0, 999]))
        elif edit == "rewire" and node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            node.input[k] = nodes[draw(st.integers(0, len(nodes) - 1))].name + draw(
                st.sampled_from(["", ":1", ":0"]))
        elif edit == "odd index" and node.input:
            k = draw(st.integers(0, len(node.input) - 1))
            node.input[k] = node.input[k].rsplit(":", 1)[0] + ":" + draw(
                st.sampled_from(ODD_INDICES))
        elif edit == "drop input" and node.input:
            del node.input[draw(st.integers(0, len(node.input) - 1))]
        elif edit == "add input":
            node.input.append(nodes[draw(st.integers(0, len(nodes) - 1))].name)
        elif edit == "duplicate":
            nodes.add().CopyFrom(node)
        elif edit == "huge dim" and "_output_shapes" in node.attr:
            for shape in node.attr["_output_shapes"].list.shape:
                for dim in shape.dim:
                    dim.size = draw(st.sampled_from([2**63 - 1, 2**40, -5]))
        elif edit == "name":
            node.name = draw(st.sampled_from(["", "a b", node.name + ":0", "^x", "é"]))
    return meta


@fuzz(25)
@given(meta=graph_edits())
def test_structural_edits_give_a_result_or_one_error_line(meta, tmp_path_factory):
    folder = tmp_path_factory.mktemp("proto")
    path, out = folder / "model.meta", folder / "out.meta"
    path.write_bytes(meta.SerializeToString())
    _assert_clean(run_cli("rewrite", path, "-o", out, "--json", "--batch-size", "8"), out)


# ---- the compiled reader against the Python one --------------------------------------

NAMES = ["a", "b", "c", "a:0", "b/c", "ä"]


@st.composite
def small_graphs(draw):
    """Graphs of a few nodes whose inputs name nodes, outputs and indices of every spelling
    (with output indices from ASCII, other Unicode digits, leading zeros, huge values)."""
    graph = protos.GraphDef()
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5))
    for name in names:
        node = graph.node.add(name=name, op=draw(st.sampled_from(
            ["Placeholder", "Identity", "AddV2", "Unknown", "IdentityN"])))
        node.attr["T"].type = draw(st.sampled_from([1, 3]))
        for _ in range(draw(st.integers(0, 3))):
            target = draw(st.sampled_from(names))
            suffix = draw(st.one_of(st.sampled_from(["", ":0", ":1", ":2", "^"]),
                                    st.sampled_from(ODD_INDICES).map(lambda s: ":" + s),
                                    st.text(st.characters(categories=["Nd", "No"]),
                                            max_size=3).map(lambda s: ":" + s)))
            node.input.append("^" + target if suffix == "^" else target + suffix)
    return graph


def _index_outcome(graph, compiled: bool, monkeypatch):
    registry = OpRegistry(use_tensorflow=False)
    with monkeypatch.context() as m:
        if not compiled:
            m.setattr(index_module, "native", None)
        try:
            ix = index_module.GraphIndex.build(graph, registry)
            check_graph(ix)
        except InputError as exc:
            return "error", str(exc)
    return ("ok", ix.names, ix.ops, ix.data_inputs, ix.control_inputs, ix.consumers,
            ix.num_outputs, ix.out_dtypes, ix.topo)


@pytest.mark.skipif(native is None, reason="graphmem._native is not built")
@fuzz(150)
@given(graph=small_graphs())
def test_the_compiled_and_python_readers_agree_on_any_graph(graph, monkeypatch):
    assert (_index_outcome(graph, True, monkeypatch)
            == _index_outcome(graph, False, monkeypatch))


@pytest.mark.skipif(native is None, reason="graphmem._native is not built")
@fuzz(30)
@given(meta=graph_edits())
def test_the_compiled_and_python_readers_agree_on_edited_fixtures(meta, monkeypatch):
    model = load_model(MLP)
    model.container.CopyFrom(meta)
    graph = model.graph_def
    registry = OpRegistry.for_graph(graph, meta, use_tensorflow=False)

    def outcome(compiled: bool):
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(index_module, "native", None)
            try:
                ix = index_module.GraphIndex.build(graph, registry)
                check_graph(ix)
            except InputError as exc:
                return str(exc)
            return ix.data_inputs, ix.num_outputs, ix.out_dtypes, ix.out_shapes, ix.topo

    assert outcome(True) == outcome(False)


# ---- option values ---------------------------------------------------------------------

NUMBERS = st.one_of(st.integers(-2**70, 2**70).map(str),
                    st.sampled_from(["1e400", "inf", "nan", "²", "١", "", " 3", "0x10",
                                     "18014398509481985", "2147483648", "1.5"]))
SIZES = st.one_of(NUMBERS, st.sampled_from(["1e400", "9e18", "1.5GiB", "10 XB", "1e19",
                                            "9223372036854775807", "-1KiB"]))
REGEXES = st.one_of(st.text(max_size=6), st.sampled_from(
    ["(", "[", "a{99999999999}", "*", "(?P<", "\\", "(?<=a+)b", "gradients/"]))


@fuzz(30)
@given(option=st.sampled_from(["--batch-size", "--max-peak", "--backward-scope", "--top"]),
       value=st.one_of(NUMBERS, SIZES, REGEXES))
def test_option_values_give_a_result_or_one_error_line(option, value):
    _assert_clean(run_cli("inspect", MLP, "--json", option, value))


@fuzz(12)
@given(option=st.sampled_from(["--swap-threshold", "--swap-include", "--swap-exclude",
                               "--swap-start", "--swap-in-ahead", "--budget",
                               "--checkpoints"]),
       value=st.one_of(SIZES, REGEXES, st.tuples(NUMBERS, NUMBERS).map(":".join)))
def test_rewrite_option_values_leave_no_output_on_error(option, value, tmp_path_factory):
    out = tmp_path_factory.mktemp("opt") / "out.meta"
    swap = ["--swap"] if option.startswith("--swap") else []
    _assert_clean(run_cli("rewrite", MLP, "-o", out, "--json", "--batch-size", "8", *swap,
                          option, value), out)
