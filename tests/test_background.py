"""The estimate computed in a forked child is the estimate computed in process."""

import os
import pickle
from pathlib import Path

import pytest

from benchmarks.synthetic import chain_training_graph
from graphmem import background
from graphmem.background import Background
from graphmem.formats.model import LoadedModel
from graphmem.graph import index as index_module
from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_workspace

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def test_child_sees_the_state_at_the_fork_not_later_edits():
    state = {"value": [1, 2, 3]}
    job = Background(lambda: sum(state["value"]), nodes=0, force=True)
    state["value"].append(100)  # the parent goes on editing
    assert job.forked
    assert job.result() == 6
    assert job.result() == 6  # asked again: the same value, no second wait


def test_failing_child_gives_no_result_and_no_exception():
    def fails():
        raise RuntimeError("boom")

    job = Background(fails, nodes=0, force=True)
    assert job.result() is None


def test_large_results_pass_through_the_pipe():
    job = Background(lambda: list(range(300_000)), nodes=0, force=True)  # > a pipe's buffer
    assert job.result() == list(range(300_000))


def test_cancel_stops_a_child_blocked_on_a_full_pipe():
    job = Background(lambda: list(range(1_000_000)), nodes=0, force=True)  # never read
    pid = job._pid
    job.cancel()
    assert not job.forked
    with pytest.raises(ChildProcessError):  # reaped: no zombie left behind
        os.waitpid(pid, os.WNOHANG)


def test_small_graphs_compute_in_process():
    calls = []
    job = Background(lambda: calls.append(1) or 7, nodes=10)
    assert not job.forked and calls == [1]  # computed at once
    assert job.result() == 7


def _rewrite(monkeypatch, fork: bool, policy: str = "memory"):
    monkeypatch.setattr(background, "MIN_NODES", 0 if fork else 10**12)
    monkeypatch.setattr(background, "fork_usable", lambda: fork)
    graph = chain_training_graph(40)
    model = LoadedModel(Path("chain.pb"), "graphdef", graph, graph)
    return rewrite_workspace(Workspace.open(model), RewriteOptions(policy, batch_size=32))


def test_rewrite_before_estimate_is_the_same_forked_or_not(monkeypatch):
    forked = _rewrite(monkeypatch, True)
    inline = _rewrite(monkeypatch, False)
    assert forked.before == inline.before
    assert forked.after == inline.after
    assert forked.before.peak_bytes > 0 and forked.plan.copied_ops > 0


def test_rewrite_recovers_when_the_child_fails(monkeypatch):
    inline = _rewrite(monkeypatch, False)

    class Unpicklable:  # the child cannot send its estimate and exits with an error
        @staticmethod
        def dumps(*args, **kwargs):
            raise RuntimeError("cannot send")

        loads = staticmethod(pickle.loads)
        HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

    monkeypatch.setattr(background, "pickle", Unpicklable)
    recovered = _rewrite(monkeypatch, True)
    assert recovered.before == inline.before


def _index(monkeypatch, fork: bool) -> GraphIndex:
    monkeypatch.setattr(background, "MIN_NODES", 0 if fork else 10**12)
    monkeypatch.setattr(background, "fork_usable", lambda: fork)
    jobs = []

    class Recorded(Background):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            jobs.append(self.forked)

    monkeypatch.setattr(index_module, "Background", Recorded)
    # the child belongs to the Python read (the compiled one groups the attrs in C)
    monkeypatch.setattr(index_module, "native", None)
    graph = chain_training_graph(30, residual=True)
    index = GraphIndex.build(graph, OpRegistry(use_tensorflow=False))
    assert jobs == [fork]  # the attrs were read in a child exactly when forking
    return index


def _sharing(lists: list) -> list[int]:
    """Which entries share one list object: the first index holding the same object."""
    first: dict[int, int] = {}
    return [first.setdefault(id(x), k) if x is not None else -1 for k, x in enumerate(lists)]


def test_index_attrs_read_in_a_child_are_those_read_in_process(monkeypatch):
    forked, inline = _index(monkeypatch, True), _index(monkeypatch, False)
    assert forked.out_dtypes == inline.out_dtypes and forked.out_shapes == inline.out_shapes
    assert forked.stateful == inline.stateful and forked.num_outputs == inline.num_outputs
    assert forked.topo == inline.topo
    # nodes of one signature share their lists either way (the size caches key on them)
    assert _sharing(forked.out_shapes) == _sharing(inline.out_shapes)
    assert _sharing(forked.out_dtypes) == _sharing(inline.out_dtypes)
    assert any(forked.stateful)  # the variables: the comparison saw real values
