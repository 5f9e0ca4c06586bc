"""The floor (analysis/floor.py): a step peak no recompute or swap plan goes under."""

import pytest

from graphmem.analysis.floor import step_floor
from graphmem.analysis.regions import analyze_regions
from graphmem.rewrite import RewriteOptions, rewrite_file
from tests.conftest import fixture_path
from tests.graphbuilder import G

F = 4  # bytes per float


def _decayed_layer() -> G:
    """A layer whose weight gradient (64 x 64) is summed with its decay term: the AddN
    holds both inputs, whatever a plan keeps (a VGG's fc6: 2 x 392 MiB)."""
    g = G()
    g.op("x", "Placeholder", shape=(8, 64))
    g.op("w", "VarHandleOp", shape=())
    g.op("read", "ReadVariableOp", "w", shape=(64, 64))
    g.op("h", "MatMul", "x", "read", shape=(8, 64))
    g.op("loss", "Sum", "h", shape=())
    g.op("gradients/seed", "Fill", "loss", shape=(8, 64))
    g.op("gradients/dw", "MatMul", "x", "gradients/seed", shape=(64, 64))
    g.op("gradients/term", "Mul", "read", "gradients/seed", shape=(64, 64))
    g.op("gradients/AddN", "AddN", "gradients/dw", "gradients/term", shape=(64, 64))
    g.op("apply", "ResourceApplyGradientDescent", "w", "gradients/AddN", shape=())
    return g


def test_the_largest_footprint_sets_the_floor_and_parameters_do_not_count():
    index = _decayed_layer().index()
    floor = step_floor(index, analyze_regions(index), None)
    assert floor.op == "gradients/AddN"
    # its two inputs; the sum may take one of their buffers; the feed x, read before,
    # need not be live there (the simulation frees it after its last reader, and TF's
    # measured peak does not count a NumPy feed)
    assert floor.bytes == 2 * 64 * 64 * F
    roles = {(p.name, p.role) for p in floor.parts}
    assert roles == {("gradients/dw:0", "input"), ("gradients/term:0", "input")}


def test_an_output_no_input_can_hold_is_counted():
    g = _decayed_layer()
    g.op("gradients/wide", "Tile", "gradients/AddN", shape=(64, 256))
    g.op("gradients/sum", "Sum", "gradients/wide", shape=(64, 64))
    g.graph_def.node[-3].input[1] = "gradients/sum"  # apply reads the new chain's sum
    index = g.index()
    floor = step_floor(index, analyze_regions(index), None)
    assert floor.op == "gradients/wide"
    assert floor.bytes == 64 * 64 * F + 64 * 256 * F


@pytest.mark.parametrize("name", ["mlp", "resnet", "transformer"])
def test_no_plan_found_goes_under_the_floor(name, tmp_path):
    result = rewrite_file(fixture_path(name), tmp_path / "out.meta",
                          RewriteOptions("budget", [], 32, budget="0.05", keep_worse=True))
    from graphmem.formats import load_model
    from graphmem.graph.workspace import Workspace

    ws = Workspace.open(load_model(fixture_path(name)), batch_size=32)
    floor = step_floor(ws.index, analyze_regions(ws.index, None, 32), 32)
    assert 0 < floor.bytes <= result.after.peak_bytes
