"""The spread of the estimated peak over TF's executor orders: the lowest and the highest
peak of the orders simulated, which one a training run reaches, and the reports' words."""

import json
from functools import partial

import pytest

from graphmem.analysis.memory import estimate_memory as _estimate_memory
from graphmem.analysis.schedule import (
    WALK_FIFO,
    WALK_LIFO,
    WALK_STEADY,
    executor_order,
)
from graphmem.report.inspect_report import shows_spread, spread_sentence
from tests.conftest import fixture_path, run_cli
from tests.graphbuilder import G

U = 8192
N = (2048,)
estimate_memory = partial(_estimate_memory, allocator=False)


def _warm_up_graph():
    # s is a's small last reader: inline in the steady state (a freed before b runs),
    # dispatched in the warm-up (b runs while a is live)
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("s", "Op", "a", shape=(4,))
    g.op("b", "Op", "x", "^a", shape=N)
    return g.index()


def test_every_order_walked_is_reported_with_its_peak():
    ix = _warm_up_graph()
    est = estimate_memory(ix)
    by_phase = {o.phase: o.peak_bytes for o in est.orders}
    assert by_phase == {"steady": 2 * U + 256, "warm-up": 3 * U}
    assert est.peak_bytes == max(by_phase.values())  # the highest: a run reaches it
    assert est.lowest_peak_bytes == 2 * U + 256
    assert (est.phase, est.lowest_phase) == ("warm-up", "steady")
    # and with how each order took the ready ops
    assert {o.walk for o in est.orders} >= {WALK_STEADY, WALK_LIFO}
    assert (est.walk, est.highest_walk, est.lowest_walk) == (WALK_LIFO, WALK_LIFO, WALK_STEADY)


def test_a_given_order_has_no_spread():
    ix = _warm_up_graph()
    est = estimate_memory(ix, order=executor_order(ix, warm_up=True))
    assert len(est.orders) == 1
    assert est.lowest_peak_bytes == est.peak_bytes == 3 * U


def test_the_spread_is_said_in_plain_words():
    text = spread_sentence(3 << 20, 2 << 20, "warm-up", "steady")
    assert "varies with TensorFlow's op order" in text
    assert "2.0 MiB (steady) to 3.0 MiB (warm-up)" in text and "1.50x" in text
    assert not shows_spread(1000, 995) and shows_spread(1000, 900)
    # above every order's own step: what earlier steps leave in the allocator, said too
    carried = spread_sentence(3 << 20, 2 << 20, "warm-up", "steady", carried=True)
    assert "varies with TensorFlow's op order and with what earlier steps leave in its " \
        "allocator" in carried and "op order and" not in text
    # two warm-up orders (TF's dispatch queues taken either way): the phase said once
    same = spread_sentence(3 << 20, 2 << 20, "warm-up", "warm-up")
    assert "from 2.0 MiB to 3.0 MiB, both in warm-up orders" in same
    assert same.count("warm-up") == 1
    # ... told apart by their walks when those are known
    walks = spread_sentence(3 << 20, 2 << 20, "warm-up", "warm-up", high_walk=WALK_LIFO,
                           low_walk=WALK_FIFO)
    assert (f"from 2.0 MiB ({WALK_FIFO}) to 3.0 MiB ({WALK_LIFO}), both in warm-up orders"
            in walks)


def test_inspect_and_rewrite_json_carry_the_spread(tmp_path):
    doc = json.loads(run_cli("inspect", fixture_path("mlp"), "--batch-size", "64",
                             "--json").stdout)
    peak = doc["peak"]
    assert peak["highest_bytes"] == doc["estimated_peak_bytes"]
    assert peak["lowest_bytes"] <= peak["highest_bytes"]
    assert peak["highest_phase"] in ("steady", "warm-up")
    assert max(o["peak_bytes"] for o in peak["orders"]) == peak["highest_bytes"]
    assert min(o["peak_bytes"] for o in peak["orders"]) == peak["lowest_bytes"]
    walks = {o["walk"] for o in peak["orders"]}
    assert WALK_STEADY in walks and {peak["highest_walk"], peak["lowest_walk"]} <= walks
    res = run_cli("rewrite", fixture_path("mlp"), "-o", tmp_path / "r.meta",
                  "--batch-size", "64", "--json")
    out = json.loads(res.stdout)
    for side in ("before", "after"):
        spread = out[side]["peak_spread"]
        assert spread["highest_bytes"] == out[side]["estimated_peak_bytes"]
        assert spread["lowest_bytes"] <= spread["highest_bytes"]
        assert spread["highest_walk"] in {o["walk"] for o in spread["orders"]}


def test_a_rewrite_is_kept_only_when_its_highest_peak_is_lower(tmp_path, monkeypatch):
    import graphmem.rewrite as rewrite
    from graphmem.rewrite import RewriteOptions, rewrite_file

    src = fixture_path("mlp")
    base = rewrite_file(src, tmp_path / "a.meta", RewriteOptions("memory", [], 64))
    assert not base.reverted and base.after.peak_bytes < base.before.peak_bytes
    # the same edits, estimated at exactly the original's highest peak: nothing gained
    original = base.before.peak_bytes
    real = rewrite._estimate

    def same_peak(ws, regions, options):
        est = real(ws, regions, options)
        est.peak_bytes = original
        return est

    monkeypatch.setattr(rewrite, "_estimate", same_peak)
    tie = rewrite_file(src, tmp_path / "b.meta", RewriteOptions("memory", [], 64))
    assert tie.reverted
    assert (tmp_path / "b.meta").read_bytes() == src.read_bytes()


def test_data_out_edges_are_activated_before_control_ones():
    # a readies c through a control edge and b through a data edge; c is earlier in the
    # GraphDef. TF activates data out-edges first, then control ones, and runs the last
    # expensive op readied next: c, while b is queued
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("c", "Op", "x", "^a", shape=N)
    g.op("b", "Op", "a", shape=N)
    ix = g.index()
    assert [ix.names[i] for i in executor_order(ix)] == ["x", "a", "c", "b"]


def _control_tie():
    # tf.gradients' groups end in control edges (as Grappler rewires them): g readies c1
    # and c2 through control edges only; c1 is big and read late, c2 frees what it reads
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=N)
    g.op("g", "Op", "a", shape=N)
    g.op("c1", "Op", "x", "^g", shape=(4 * 2048,))
    g.op("c2", "Op", "a", "^g", shape=(4,))
    g.op("end", "Op", "c1", "c2", shape=N)
    return g.index()


def test_ops_readied_together_are_also_walked_in_reverse_order():
    # TF's out-edge order after Grappler is not always the GraphDef's (traced on tf-slim's
    # AlexNet, where it held every weight gradient to the end of the backward pass): the
    # warm-up is walked both ways, the control-readied ops in reverse order too, and the
    # estimate keeps the higher peak
    ix = _control_tie()
    forward = executor_order(ix, warm_up=True)
    reverse = executor_order(ix, warm_up=True, reverse=True)
    assert [ix.names[i] for i in forward][3:5] == ["c2", "c1"]
    assert [ix.names[i] for i in reverse][3:5] == ["c1", "c2"]
    est = estimate_memory(ix)
    peaks = [estimate_memory(ix, order=o).peak_bytes for o in (forward, reverse)]
    assert peaks[0] != peaks[1] and est.peak_bytes >= max(peaks)


def test_big_steps_are_walked_in_graph_order_only(monkeypatch):
    from graphmem.analysis import schedule

    ix = _control_tie()
    assert executor_order(ix, warm_up=True, reverse=True) in [
        order for _, _, order in schedule.executor_walks(ix)]
    monkeypatch.setattr(schedule, "REVERSE_WALK_OPS", len(ix) - 1)
    assert all(order in (executor_order(ix), executor_order(ix, warm_up=True))
               for _, _, order in schedule.executor_walks(ix))


def _two_branches():
    # x readies a and b together, each big and read by a small op: one thread runs one
    # branch to its end before the other (a's buffer freed before b's is made), two
    # threads run a and b side by side
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=(8 * 2048,))
    g.op("ra", "Op", "a", shape=(4,))
    g.op("b", "Op", "x", shape=(8 * 2048,))
    g.op("rb", "Op", "b", shape=(4,))
    g.op("end", "Op", "ra", "rb", shape=(4,))
    return g.index()


def test_two_threads_run_ops_readied_together_side_by_side():
    from graphmem.analysis.schedule import two_thread_order

    ix = _two_branches()
    walk = two_thread_order(ix)
    order, start, end = walk.order, walk.start_at, walk.end_at
    assert sorted(order) == list(range(len(ix)))
    at = {ix.names[i]: p for p, i in enumerate(order)}
    a, b = at["a"], at["b"]
    assert start[a] == start[b] and end[a] > start[b] and end[b] > start[a]
    for p, i in enumerate(order):  # no op starts before what it reads has ended
        for s, _ in ix.data_inputs[i]:
            assert end[at[ix.names[s]]] <= start[p]


def test_the_modelled_step_time_counts_ops_side_by_side_once_at_two_threads():
    """One thread runs every op in turn (the ops' times added up); two run the two
    branches side by side, so the step takes about one branch less. A chain gains
    nothing from a second thread."""
    from graphmem.analysis.cost import op_times
    from graphmem.analysis.schedule import StepTimes, two_thread_order

    ix = _two_branches()
    walk = two_thread_order(ix)
    times = op_times(ix, range(len(ix)), None)
    at = {ix.names[i]: i for i in range(len(ix))}
    branch = times[at["a"]] + times[at["ra"]]
    assert walk.times.one_thread == pytest.approx(2 * branch + times[at["end"]])  # x runs inline
    assert walk.times.two_threads == pytest.approx(branch + times[at["end"]])
    assert walk.times.ratio(StepTimes(walk.times.one_thread / 2, walk.times.two_threads)) == (2.0, 1.0)
    g = G()
    g.op("x", "Placeholder", shape=N)
    g.op("a", "Op", "x", shape=(8 * 2048,))
    g.op("b", "Op", "a", shape=(8 * 2048,))
    chain = two_thread_order(g.index())
    assert chain.times.two_threads == pytest.approx(chain.times.one_thread)
    est = _estimate_memory(ix)
    assert est.step_times == walk.times  # the estimate carries them
    assert _estimate_memory(ix, two_threads=False).step_times is None


def test_a_slice_or_an_in_place_update_moves_its_part_of_the_buffer_only():
    """The in-place weight-decay terms (passes/in_place_terms.py) read a large variable
    slice by slice and add each term into a slice of the gradient's buffer: counted as
    moving the whole buffer each time, tf-slim AlexNet v2's rewrite without any recompute
    was modelled 1.22x the original's step; each piece moves its slice's bytes."""
    from graphmem.analysis.cost import BYTE_COST, op_times

    g = G()
    g.op("w", "Placeholder", shape=(64, 1024))
    g.op("g", "Placeholder", shape=(64, 1024))
    g.op("begin", "Const", shape=(2,))
    g.op("size", "Const", shape=(2,))
    g.op("piece", "Slice", "w", "begin", "size", shape=(1, 1024))
    g.op("term", "Mul", "piece", "piece", shape=(1, 1024))
    g.op("at", "Const", shape=(1,))
    g.op("sum", "InplaceAdd", "g", "at", "term", shape=(64, 1024))
    ix = g.index()
    times = op_times(ix, range(len(ix)), None)
    at = {ix.names[i]: i for i in range(len(ix))}
    row = 1024 * 4
    assert times[at["piece"]] < BYTE_COST * 3 * row  # its slice in and out, not w's 64 rows
    assert times[at["sum"]] < BYTE_COST * 4 * row
    assert times[at["term"]] >= BYTE_COST * 3 * row  # an element-wise op reads it all


def test_the_two_thread_peak_counts_in_the_highest_only():
    ix = _two_branches()
    big = 8 * U
    est = _estimate_memory(ix)
    one = [o.peak_bytes for o in est.orders if o.threads == 1]
    two = [o.peak_bytes for o in est.orders if o.threads == 2]
    assert len(two) == 1 and max(one) < big + U + 2 * 256 + 1  # one branch at a time
    assert two[0] >= 2 * big  # both branches live together
    assert est.highest_threads == 2 and est.estimated_bytes >= two[0]
    assert est.peak_bytes == max(one)  # plans are still ranked on one thread's orders
    assert _estimate_memory(ix, two_threads=False).estimated_bytes == max(one)


def test_big_steps_skip_the_two_thread_walk(monkeypatch):
    from graphmem.analysis import schedule

    ix = _two_branches()
    monkeypatch.setattr(schedule, "REVERSE_WALK_OPS", len(ix) - 1)
    assert schedule.two_thread_order(ix) is None
    assert all(o.threads == 1 for o in _estimate_memory(ix).orders)


def test_the_reports_name_two_threads():
    from graphmem.analysis.inspect import order_spread
    from graphmem.report.inspect_report import threads_label

    spread = order_spread(_estimate_memory(_two_branches()))
    assert spread["highest_threads"] == 2
    assert {o["threads"] for o in spread["orders"]} == {1, 2}
    assert threads_label("warm-up", 2) == "warm-up, 2 inter-op threads"
    assert threads_label("steady", 1) == "steady"
