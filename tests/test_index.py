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
