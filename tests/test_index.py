import pytest

from graphmem.errors import InputError
from graphmem.graph.names import input_string, parse_input
from tests.graphbuilder import G


def test_parse_input_forms():
    assert parse_input("a") == ("a", 0, False)
    assert parse_input("scope/a:2") == ("scope/a", 2, False)
    assert parse_input("^scope/a") == ("scope/a", -1, True)
    assert input_string("a", 0) == "a" and input_string("a", 3) == "a:3"


def test_topological_order_respects_control_edges():
    g = G()
    # file order puts consumers first; the control edge c -> a must also be honoured
    g.op("d", "Add", "b", "c")
    g.op("a", "Const", "^c")
    g.op("b", "Relu", "a")
    g.op("c", "Const")
    ix = g.index()
    pos = {ix.names[i]: p for p, i in enumerate(ix.topo)}
    assert pos["c"] < pos["a"] < pos["b"] < pos["d"]
    assert ix.control_consumers[ix.id_of["c"]] == [ix.id_of["a"]]
    assert sorted(ix.consumers[(ix.id_of["c"], 0)]) == [ix.id_of["d"]]


def test_cycle_is_an_input_error():
    g = G()
    g.op("a", "Relu", "b")
    g.op("b", "Relu", "a")
    with pytest.raises(InputError, match="cycle"):
        g.index()


def test_missing_input_is_an_input_error():
    g = G()
    g.op("a", "Relu", "ghost:1")
    with pytest.raises(InputError, match="ghost"):
        g.index()


def test_v1_loop_frames_and_back_edge():
    g = G()
    g.op("x", "Const")
    g.op("w/Enter", "Enter", "x", frame_name=b"w")
    g.op("w/Merge", "Merge", "w/Enter", "w/NextIteration")
    g.op("w/body", "Relu", "w/Merge")
    g.op("w/NextIteration", "NextIteration", "w/body")
    g.op("w/Exit", "Exit", "w/Merge")
    g.op("after", "Relu", "w/Exit")
    ix = g.index()  # the NextIteration -> Merge back edge is no cycle
    frame = {ix.names[i]: ix.frame[i] for i in range(len(ix))}
    assert frame["x"] == "" and frame["after"] == "" and frame["w/Exit"] == ""
    assert frame["w/Merge"] == frame["w/body"] == frame["w/NextIteration"] == "/w"
    assert ix.frames() == {"/w": 4}


def _random_dag(seed: int, n: int = 300) -> G:
    """Nodes in shuffled file order, with data edges (some to output 1, some repeated)
    and control edges, plus a v1 loop whose NextIteration -> Merge edge is a back edge."""
    import random

    rnd = random.Random(seed)
    names = [f"n{i}" for i in range(n)]
    specs = []
    for i in range(n):
        ins = []
        for _ in range(rnd.randint(0, 3) if i else 0):
            j = rnd.randrange(i)
            ins.append(f"n{j}:1" if rnd.random() < 0.2 else f"n{j}")
        if i and rnd.random() < 0.3:
            ins.append(f"^n{rnd.randrange(i)}")
        specs.append((names[i], "AddN" if ins and not ins[0].startswith("^") else "Const", ins))
    rnd.shuffle(specs)
    g = G()
    for name, op, ins in specs:
        g.op(name, op, *ins)
    g.op("w/Enter", "Enter", "n0", frame_name=b"w")
    g.op("w/Merge", "Merge", "w/Enter", "w/NextIteration")
    g.op("w/body", "Relu", "w/Merge")
    g.op("w/NextIteration", "NextIteration", "w/body")
    g.op("w/Exit", "Exit", "w/Merge")
    return g


@pytest.mark.parametrize("seed", range(5))
def test_toposort_is_kahn_over_ordering_preds(seed):
    """The index's own Kahn pass (no predecessor lists) must give exactly the order the
    reference `kahn` gives over `ordering_preds`: every analysis reads `topo`."""
    from graphmem.graph.index import kahn

    ix = _random_dag(seed).index()
    order, indeg = kahn([ix.ordering_preds(i) for i in range(len(ix))])
    assert len(order) == len(ix) and not any(indeg)
    assert ix._kahn() == (order, indeg)


def test_may_be_dead_without_switches_is_all_false():
    """Without a Switch no op runs in a branch: the shortcut must agree with the walk."""
    ix = _random_dag(0).index()
    assert not any(ix.may_be_dead(i) for i in range(len(ix)))
    assert all(c == () for c in ix._branch_contexts())


def test_attr_of_reads_a_missing_attr_without_adding_it():
    from graphmem.graph.index import attr_of

    g = G()
    node = g.op("e", "Enter", shape=(4,))
    node.attr["frame_name"].s = b"f"
    assert attr_of(node, "frame_name").s == b"f"
    assert not attr_of(node, "is_constant").b and attr_of(node, "parallel_iterations").i == 0
    assert "is_constant" not in node.attr and "parallel_iterations" not in node.attr
