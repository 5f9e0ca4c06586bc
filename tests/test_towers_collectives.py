"""The order of collective ops: no rewrite may copy one or order two the original leaves
unordered (every replica must issue collectives in one order, or training hangs)."""

import pytest

from benchmarks.towers_bench import tf1_towers_graph
from graphmem.analysis.towers import (
    check_collective_order,
    collective_order,
    collective_order_changes,
    collectives,
)
from graphmem.errors import InputError
from graphmem.formats import load_model
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from tests.graphbuilder import G


def _two_towers(extra=()):
    """Per tower k: two collectives on independent inputs (unordered), then a sum."""
    g = G()
    for k in range(2):
        dev = f"/device:CPU:{k}"
        g.op(f"x{k}", "Placeholder", device=dev)
        g.op(f"y{k}", "Placeholder", device=dev)
        g.op(f"a{k}", "CollectiveReduceV2", f"x{k}", device=dev)
        g.op(f"b{k}", "CollectiveReduceV2", f"y{k}", device=dev)
        g.op(f"s{k}", "AddV2", f"a{k}", f"b{k}", device=dev)
    for name, op, *inputs in extra:
        g.op(name, op, *inputs)
    return g


def test_unrelated_edges_keep_the_order():
    before = _two_towers().index()
    g = _two_towers()
    g.graph_def.node[0].input.append("^y0")  # x0 waits for y0: no collective in between
    assert collective_order_changes(before, g.index()) == []


def test_an_edge_between_unordered_collectives_is_refused():
    before = _two_towers().index()
    g = _two_towers()
    next(n for n in g.graph_def.node if n.name == "b0").input.append("^a0")
    changes = collective_order_changes(before, g.index())
    assert [(c.first, c.second) for c in changes] == [("a0", "b0")]
    with pytest.raises(InputError, match="wait for a0"):
        check_collective_order(before, g.index())


def test_an_ordering_through_other_ops_is_found():
    before = _two_towers().index()
    g = _two_towers()
    g.op("t", "Identity", "a1")  # appended, as passes append
    next(n for n in g.graph_def.node if n.name == "y1").input.append("^t")
    assert [(c.first, c.second) for c in collective_order_changes(before, g.index())] == \
        [("a1", "b1")]


def test_a_copied_collective_is_refused():
    before = _two_towers().index()
    g = _two_towers(extra=[("a0/graphmem_recompute_s1", "CollectiveReduceV2", "x0")])
    with pytest.raises(InputError, match="copies the collective op"):
        check_collective_order(before, g.index())


def test_order_masks_over_many_collectives():
    # more collectives than one machine word: a chain, each depending on all before it
    g = G()
    g.op("c0", "CollectiveReduceV2")
    for k in range(1, 150):
        g.op(f"c{k}", "CollectiveReduceV2", f"c{k - 1}")
    index = g.index()
    ids = collectives(index)
    masks = collective_order(index, ids)
    slot = {index.names[c]: n for n, c in enumerate(ids)}
    assert bin(masks[slot["c149"]]).count("1") == 149
    assert bin(masks[slot["c70"]]).count("1") == 70
    assert masks[slot["c0"]] == 0


@pytest.mark.tf
def test_rewrite_of_an_all_reduced_tower_graph_keeps_the_order(tmp_path):
    src = tf1_towers_graph(tmp_path / "coll.meta", towers=2, layers=6, width=64,
                           features=32, collective=True)
    out = tmp_path / "out.meta"
    result = rewrite_file(src, out, RewriteOptions("memory", [], 32, early_updates=True))
    assert result.plan.copied_ops > 0
    before = Workspace.open(load_model(src)).index
    after = Workspace.open(load_model(out)).index
    assert len(collectives(before)) == 2 * 13
    assert len(collectives(after)) == len(collectives(before))  # none copied
    assert collective_order_changes(before, after) == []
    # every weight's update reads an all-reduced gradient (the global step's waits for them)
    assert result.early.updates == 0
    assert result.early.skipped.get("its gradient comes from a collective op", 0) >= 13
