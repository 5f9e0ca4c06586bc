from graphmem.analysis.dominators import SOURCE, bottlenecks, immediate_dominators


def test_diamond_chain_bottlenecks_are_the_joints():
    # 0 -> (1 | 2) -> 3 -> (4 | 5) -> 6 : only 0, 3 and the sink's joints dominate
    edges = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (3, 5), (4, 6), (5, 6)]
    assert bottlenecks(list(range(7)), edges, [6]) == [0, 3]


def test_skip_connection_removes_bottlenecks_it_jumps_over():
    # 0 -> 1 -> 2 -> 3 -> 4 with a skip 0 -> 3
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 3)]
    assert bottlenecks(list(range(5)), edges, [4]) == [0, 3]


def test_two_roots_meet_at_source():
    idom = immediate_dominators([0, 1, 2], {2: [0, 1]})
    assert idom == {0: SOURCE, 1: SOURCE, 2: SOURCE}


def test_several_sinks_are_joined():
    edges = [(0, 1), (1, 2), (1, 3)]
    assert bottlenecks([0, 1, 2, 3], edges, [2, 3]) == [0, 1]


def test_long_chain_is_fast_and_complete():
    n = 200_000
    edges = [(i, i + 1) for i in range(n - 1)]
    assert len(bottlenecks(list(range(n)), edges, [n - 1])) == n - 1
