"""Hostile input, case by case: each way a model file, a file system or an option value
once made graphmem hang, replace what it must not, end in an internal error, leave an
output behind, or let a graph TensorFlow refuses pass. Each must now give one
`graphmem: error:` line and exit 2, with nothing written."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from graphmem import options, protos
from graphmem.analysis import bfc
from graphmem.errors import InputError, UsageError
from graphmem.formats.save import write_atomic
from graphmem.graph import index as index_module
from graphmem.graph.names import INDEX_LIMIT, parse_input
from graphmem.native import native
from graphmem.units import parse_size
from tests.conftest import DATA, run_cli

MLP = DATA / "mlp.meta"
needs_native = pytest.mark.skipif(native is None, reason="graphmem._native is not built")


def _assert_refused(result, fragment: str = "", output=None):
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("graphmem: error: "), result.stderr
    assert fragment in lines[0], lines[0]
    if output is not None:
        assert not os.path.lexists(output) or not stat.S_ISREG(os.lstat(output).st_mode)
        leftovers = [p.name for p in output.parent.iterdir() if p.name.startswith(".")]
        assert not leftovers, leftovers


def _meta():
    meta = protos.MetaGraphDef()
    meta.ParseFromString(MLP.read_bytes())
    return meta


def _first(graph, op):
    return next(n for n in graph.node if n.op == op)


# ---- outputs that must not be replaced ----------------------------------------------

def test_a_device_is_never_replaced():
    before = os.stat("/dev/null")
    _assert_refused(run_cli("rewrite", MLP, "-o", "/dev/null"), "a device")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_a_symlink_to_the_input_is_not_replaced(tmp_path):
    model = tmp_path / "model.meta"
    shutil.copy(MLP, model)
    link = tmp_path / "link.meta"
    link.symlink_to(model)
    _assert_refused(run_cli("rewrite", model, "-o", link), "symbolic link")
    assert link.is_symlink() and model.read_bytes() == MLP.read_bytes()


def test_the_input_itself_is_not_an_output(tmp_path):
    model = tmp_path / "model.meta"
    shutil.copy(MLP, model)
    _assert_refused(run_cli("rewrite", model, "-o", model), "the input model")
    _assert_refused(run_cli("rewrite", model, "-o", f"{tmp_path}/./model.meta"), "the input")
    assert model.read_bytes() == MLP.read_bytes()


def test_a_named_pipe_is_not_an_output(tmp_path):
    fifo = tmp_path / "out.meta"
    os.mkfifo(fifo)
    _assert_refused(run_cli("rewrite", MLP, "-o", fifo), "named pipe")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_no_output_inside_the_input_saved_model(tmp_path):
    model = tmp_path / "sm"
    shutil.copytree(DATA / "tf2_saved_model", model)
    before = sorted(p.name for p in model.rglob("*"))
    _assert_refused(run_cli("rewrite", model, "-o", model / "inside"), "inside the input")
    _assert_refused(run_cli("rewrite", model, "-o", model / "variables" / "x"), "inside")
    assert sorted(p.name for p in model.rglob("*")) == before


def test_write_atomic_refuses_what_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    for target in (fifo, link):
        with pytest.raises(InputError, match="not a regular file"):
            write_atomic(target, b"data")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "pipe"]
    plain = tmp_path / "plain"
    plain.write_bytes(b"old")
    write_atomic(plain, b"new")
    assert plain.read_bytes() == b"new"


def test_a_name_too_long_is_an_input_error(tmp_path):
    _assert_refused(run_cli("inspect", tmp_path / ("m" * 305 + ".meta")), "too long")
    out = tmp_path / ("o" * 300 + ".meta")
    _assert_refused(run_cli("rewrite", MLP, "-o", out), "longer than")


# ---- inputs that would block or fail a copy half-way --------------------------------

def test_a_named_pipe_as_the_model_does_not_block(tmp_path):
    fifo = tmp_path / "model.meta"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "graphmem.cli", "inspect", str(fifo)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "named pipe" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kind", ["fifo", "dangling", "loop", "parent"])
def test_saved_models_holding_odd_files_are_refused(kind, tmp_path):
    model = tmp_path / "sm"
    shutil.copytree(DATA / "tf2_saved_model", model)
    extra = model / "variables" / "extra"
    if kind == "fifo":
        os.mkfifo(extra)
    elif kind == "dangling":
        extra.symlink_to(tmp_path / "nothing")
    elif kind == "loop":
        extra.symlink_to(extra)
    else:  # a link to a directory holding it: a copy would copy itself without end
        extra.symlink_to(model)
    out = tmp_path / "out"
    _assert_refused(run_cli("rewrite", model, "-o", out), "cannot read", out)
    assert not out.exists()


# ---- option values ---------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--backward-scope", "--swap-include", "--swap-exclude",
                                    "--swap-start"])
def test_invalid_regexes_are_usage_errors(option, tmp_path):
    out = tmp_path / "out.meta"
    for bad in ("(", "a{99999999999}"):
        _assert_refused(run_cli("rewrite", MLP, "-o", out, "--swap", option, bad),
                        "not a valid regular expression", out)


@pytest.mark.parametrize("option,value", [
    ("--batch-size", "18014398509481985"), ("--batch-size", "1e400"),
    ("--max-peak", "1e400"), ("--max-peak", "9223372036854775808"),
    ("--swap-threshold", "1e400"), ("--swap-threshold", "inf"), ("--budget", "1e400"),
    ("--budget", "nan"), ("--swap-in-ahead", "²:3"), ("--swap-in-ahead", "1:99999999999"),
    ("--top", "-1")])
def test_huge_or_infinite_values_are_usage_errors(option, value, tmp_path):
    out = tmp_path / "out.meta"
    swap = ["--swap"] if option.startswith("--swap") else []
    _assert_refused(run_cli("rewrite", MLP, "-o", out, *swap, option, value), option, out)


def test_sizes_stay_inside_64_bits():
    assert parse_size("1.5GiB") == 1610612736
    assert parse_size("8GiB") == 8 * 2**30
    for bad in ("1e400", "inf", "nan", "9223372036854775808", "8.1e18KiB"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_plot_problems_are_found_before_anything_is_written(tmp_path, monkeypatch):
    out = tmp_path / "out.meta"
    _assert_refused(run_cli("rewrite", MLP, "-o", out, "--plot", tmp_path / "p.bmp"),
                    ".svg or .png", out)
    monkeypatch.setattr(options, "_has_module", lambda name: False)
    _assert_refused(run_cli("rewrite", MLP, "-o", out, "--plot", tmp_path / "p.png"),
                    "matplotlib", out)
    same = tmp_path / "both.svg"
    _assert_refused(run_cli("rewrite", MLP, "-o", same, "--plot", same), "another output", same)


# ---- graphs: bounded work, the same answer from both readers, TF's own checks ---------

def test_the_allocator_replay_stops_at_its_limit_in_both_paths(monkeypatch):
    events = [((0, 0), "/gpu:0", 2**60, 0), (0,), ((0, 0), None)]
    with pytest.raises(InputError, match="more than 4 PiB"):
        bfc.replay_step(events, [], None, False)
    monkeypatch.setattr(bfc, "native", None)
    with pytest.raises(InputError, match="more than 4 PiB"):
        bfc.replay_step(events, [], None, False)
    with pytest.raises(OverflowError):
        bfc.BFCAllocator().allocate(2**53)


def _edited(tmp_path, edit, name="model.meta"):
    meta = _meta()
    edit(meta.graph_def)
    path = tmp_path / name
    path.write_bytes(meta.SerializeToString())
    return path


def _both_ways(*args):
    """Exit code and stderr with the extension and without it, in fresh processes."""
    outs = []
    for pure in ("0", "1"):
        done = subprocess.run([sys.executable, "-m", "graphmem.cli", *map(str, args)],
                              capture_output=True, text=True, timeout=300,
                              env=dict(os.environ, GRAPHMEM_PURE_PYTHON=pure))
        outs.append((done.returncode, done.stderr))
    return outs


@pytest.mark.parametrize("suffix", ["²", "0١", "𝟘", "0000000001", "999999999", "1" + "0" * 40])
def test_odd_output_indices_get_one_answer_from_both_readers(suffix, tmp_path, monkeypatch):
    def edit(graph):
        node = _first(graph, "MatMul")
        node.input[0] = node.input[0].split(":")[0] + ":" + suffix

    path = _edited(tmp_path, edit)
    meta = protos.MetaGraphDef()
    meta.ParseFromString(path.read_bytes())
    from graphmem.graph.opdefs import OpRegistry

    answers = []
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(index_module, "native", None)
        with pytest.raises(InputError) as err:
            index_module.GraphIndex.build(meta.graph_def, OpRegistry.for_graph(
                meta.graph_def, meta, use_tensorflow=False))
        answers.append(str(err.value))
    assert answers[0] == answers[1]
    assert ("not in the graph" if not suffix.isascii() else "has 1 output") in answers[0]


def test_parse_input_takes_ascii_digits_only():
    assert parse_input("x:0000000001") == ("x", 1, False)
    assert parse_input("x:²") == ("x:²", 0, False)
    assert parse_input("x:" + "9" * 40) == ("x", INDEX_LIMIT, False)
    assert parse_input("a:b:3") == ("a:b", 3, False)


def test_an_output_index_past_the_op_is_refused_at_once(tmp_path):
    def edit(graph):
        node = _first(graph, "MatMul")
        node.input[1] = node.input[1].split(":")[0] + ":999999999"

    (code_c, err_c), (code_py, err_py) = _both_ways("inspect", _edited(tmp_path, edit))
    assert code_c == code_py == 2 and err_c == err_py and "has 1 output" in err_c


def test_a_huge_static_dimension_is_an_input_error_either_way(tmp_path):
    def edit(graph):
        node = _first(graph, "MatMul")
        node.attr["_output_shapes"].list.shape[0].dim[0].size = 2**63 - 1

    # sizes are computed only with a batch size (the MLP's inputs are [?, 64])
    (code_c, err_c), (code_py, err_py) = _both_ways("inspect", _edited(tmp_path, edit),
                                                    "--batch-size", "4")
    assert code_c == code_py == 2 and err_c == err_py and "more than 4 PiB" in err_c


@pytest.mark.parametrize("edit,fragment", [
    # of the attrs Relu lacks (grad_a, grad_b, transpose_a, transpose_b) the first in order,
    # whatever order the map holds them in
    (lambda g: setattr(_first(g, "MatMul"), "op", "Relu"), "(Relu) does not match its op's "
     "definition: attr 'grad_a' is not one of the op's"),
    (lambda g: _first(g, "MatMul").attr.pop("T"), "no attr 'T'"),
    (lambda g: setattr(_first(g, "MatMul").attr["T"], "type", 999), "no valid DataType"),
    (lambda g: _first(g, "MatMul").input.pop(), "takes 2 inputs, not 1"),
    (lambda g: setattr(_first(g, "BiasAdd").attr["data_format"], "s", b"XYZ"),
     "not one of the values the op allows"),
    (lambda g: g.node.add(name="a b", op="NoOp"), "TensorFlow does not allow"),
])
def test_nodes_that_do_not_match_their_op_definition_are_named(edit, fragment, tmp_path):
    out = tmp_path / "out.meta"
    _assert_refused(run_cli("rewrite", _edited(tmp_path, edit), "-o", out), fragment, out)


def test_a_string_constant_where_a_float_goes_is_refused(tmp_path):
    def edit(graph):
        reader = _first(graph, "MatMul")
        const = graph.node.add(name="text", op="Const")
        const.attr["dtype"].type = 7  # DT_STRING
        const.attr["value"].tensor.dtype = 7
        reader.input[0] = "text"

    out = tmp_path / "out.meta"
    _assert_refused(run_cli("rewrite", _edited(tmp_path, edit), "-o", out),
                    "input 0 is string from 'text', where it takes float32", out)


def test_hand_built_graphs_are_not_held_to_tensorflow_op_definitions():
    """Test and benchmark graphs set `T` on every node and skip inputs graphmem does not
    read; without TF's version stamp they are not checked (TF-written files are)."""
    from benchmarks.synthetic import chain_training_graph
    from graphmem.formats.model import Format, LoadedModel
    from graphmem.graph.workspace import Workspace

    graph = chain_training_graph(3)
    assert not graph.versions.producer
    ws = Workspace.open(LoadedModel(DATA / "chain.pb", Format.GRAPHDEF, graph, graph))
    assert len(ws.index) == len(graph.node)
    graph.versions.producer = 1500
    with pytest.raises(InputError, match="does not match its op's definition"):
        Workspace.open(LoadedModel(DATA / "chain.pb", Format.GRAPHDEF, graph, graph))


def test_every_exception_of_tensorflows_import_is_one_error_line(tmp_path):
    """A GraphDef without `_output_shapes` goes through TF's import for its shapes: an op
    type nobody defines (accepted by graphmem, which does not guess) and a string attr
    that is not UTF-8 are TF's errors, reported as one line."""
    pytest.importorskip("tensorflow")
    from graphmem.formats import load_model

    graph = load_model(DATA / "mlp.pb").graph_def
    node = _first(graph, "Relu")
    node.op = "NoSuchOpAnywhere"
    path = tmp_path / "unknown.pb"
    path.write_bytes(graph.SerializeToString())
    _assert_refused(run_cli("inspect", path), "TensorFlow cannot import the graph")
    graph = load_model(DATA / "mlp.pb").graph_def
    _first(graph, "BiasAdd").attr["data_format"].s = b"N\xffHWC"
    path = tmp_path / "bytes.pbtxt"
    path.write_text(protos.to_text(graph))
    _assert_refused(run_cli("inspect", path), "data_format")
