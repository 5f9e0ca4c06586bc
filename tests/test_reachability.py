"""The reachability index and in-place index updates, on graphs whose answers are known."""

import itertools
import random

from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry
from graphmem.graph.reachability import Reachability
from tests.graphbuilder import G


def _diamond_chain(blocks: int) -> G:
    """x -> (l_i, r_i) -> j_i -> ... : every j_i reaches everything after it; l_i and r_i
    never reach each other."""
    g = G()
    g.op("x", "Const")
    prev = "x"
    for i in range(blocks):
        g.op(f"l{i}", "Relu", prev)
        g.op(f"r{i}", "Tanh", prev)
        g.op(f"j{i}", "AddV2", f"l{i}", f"r{i}")
        prev = f"j{i}"
    return g


def _brute_force(ix: GraphIndex) -> set[tuple[int, int]]:
    pairs = set()
    for u in range(len(ix)):
        for v in ix.descendants([u]):
            pairs.add((u, v))
    return pairs


def test_diamond_chain_answers():
    ix = _diamond_chain(30).index()
    reach = Reachability(ix)
    n = ix.id_of
    assert reach.reaches(n["j0"], n["j29"]) is True
    assert reach.reaches(n["l3"], n["r20"]) is True
    assert reach.reaches(n["l3"], n["r3"]) is False
    assert reach.reaches(n["j5"], n["j4"]) is False
    assert reach.reaches(n["r7"], n["l7"]) is False


def test_every_pair_matches_a_brute_force_walk_on_a_random_dag():
    rng = random.Random(7)
    g = G()
    names = []
    for i in range(60):
        inputs = rng.sample(names, k=min(len(names), rng.randint(0, 3)))
        ctrl = ["^" + c for c in rng.sample(names, k=min(len(names), rng.randint(0, 1)))]
        g.op(f"n{i}", "AddN", *inputs, *ctrl)
        names.append(f"n{i}")
    ix = g.index()
    truth = _brute_force(ix)
    reach = Reachability(ix, landmarks=[ix.id_of["n30"], ix.id_of["n59"]])
    for u, v in itertools.product(range(len(ix)), repeat=2):
        assert reach.reaches(u, v) is ((u, v) in truth), (ix.names[u], ix.names[v])


def test_a_search_past_its_budget_answers_none_never_a_guess():
    ix = _diamond_chain(200).index()
    reach = Reachability(ix)
    assert reach.reaches(ix.id_of["j0"], ix.id_of["j199"], budget=10) is None
    # through a landmark the same question needs no search
    marked = Reachability(ix, landmarks=[ix.id_of["j100"]])
    assert marked.reaches(ix.id_of["j0"], ix.id_of["j199"], budget=10) is True


def test_loop_back_edges_are_left_out():
    g = G()
    g.op("x", "Const")
    g.op("w/Enter", "Enter", "x", frame_name=b"w")
    g.op("w/Merge", "Merge", "w/Enter", "w/NextIteration")
    g.op("w/body", "Relu", "w/Merge")
    g.op("w/NextIteration", "NextIteration", "w/body")
    g.op("w/Exit", "Exit", "w/Merge")
    ix = g.index()
    reach = Reachability(ix)
    assert reach.reaches(ix.id_of["x"], ix.id_of["w/Exit"]) is True
    assert reach.reaches(ix.id_of["w/body"], ix.id_of["w/Merge"]) is False  # back edge


def test_added_control_edges_update_the_index_as_a_rebuild_would():
    g = _diamond_chain(5)
    ix = g.index()
    edges = [(ix.id_of["r4"], ix.id_of["l4"]), (ix.id_of["l0"], ix.id_of["r0"])]
    assert ix.position[ix.id_of["r4"]] > ix.position[ix.id_of["l4"]]  # against the order
    for src, dst in edges:
        g.graph_def.node[dst].input.append("^" + ix.names[src])
    ix.add_control_edges(edges)
    fresh = g.index()
    assert ix.control_inputs == fresh.control_inputs
    assert ix.control_consumers == fresh.control_consumers
    for src, dst in edges:  # the order was redone where an edge ran against it
        assert ix.position[src] < ix.position[dst]


def test_build_on_a_previous_index_equals_a_fresh_build():
    g = _diamond_chain(5)
    first = g.index()
    # a pass appends a copy and reroutes a reader, as recompute does
    g.op("copy/l2", "Relu", "j1")
    g.graph_def.node[first.id_of["j2"]].input[0] = "copy/l2"
    registry = OpRegistry(use_tensorflow=False)
    again = GraphIndex.build(g.graph_def, registry, previous=first)
    fresh = GraphIndex.build(g.graph_def, registry)
    for field in ("names", "ops", "id_of", "data_inputs", "control_inputs", "consumers",
                  "num_outputs", "out_dtypes", "stateful", "topo", "position", "frame"):
        assert getattr(again, field) == getattr(fresh, field), field
    assert [again.shapes_of(i) for i in range(len(again))] == \
        [fresh.shapes_of(i) for i in range(len(fresh))]
