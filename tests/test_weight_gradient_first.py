"""A cheap first layer's output, copied twice for its own gradient ops (recompute.py,
_readers_first): the next layer's weight gradient reads a copy of its own and runs before
the input gradient beside it, and the layer's own gradient ops read a second copy made after
both. tf-slim VGG-16 at 224 px held 3 x 392 MiB at conv1_2's backward without it."""

from __future__ import annotations

import pytest

from graphmem.formats import load_model
from graphmem.graph.names import is_copy, original_name
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify
from tests.test_fusion_guard import biased_convnet

pytestmark = pytest.mark.tf

BATCH = 8
FIRST = "Relu"  # the cheap first layer (3 input channels), whose output is copied


@pytest.fixture(scope="module")
def wide_first(tmp_path_factory):
    # the first block's outputs are the step's largest tensors, as in VGG
    return biased_convnet(tmp_path_factory.mktemp("first") / "convnet.meta",
                          channels=(32, 32, 48, 48), side=64)


def _rewrite(src, out, monkeypatch, split: bool):
    import graphmem.passes.recompute as rc
    import graphmem.rewrite as rw

    choose = rw.choose_checkpoints

    def late_copies(*args, **kwargs):  # the pooled tensors kept, late copies on
        choice = choose(*args, **kwargs)
        choice.lead, choice.late_copies = False, True
        return choice

    monkeypatch.setattr(rw, "choose_checkpoints", late_copies)
    if not split:
        monkeypatch.setattr(rc, "_readers_first", lambda *a: (set(), []))
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    return rewrite_file(src, out, options)


def test_weight_gradient_reads_its_own_copy_and_runs_first(wide_first, tmp_path,
                                                           monkeypatch):
    out = tmp_path / "out.meta"
    result = _rewrite(wide_first, out, monkeypatch, split=True)
    assert result.plan.order_edges >= 1
    from graphmem.report.rewrite_report import rewrite_document

    assert rewrite_document(result, str(out))["weight_gradients_run_first"] == \
        result.plan.order_edges
    ix = Workspace.open(load_model(str(out))).index
    grad = "gradients/Conv2D_1_grad"
    weights, inputs = ix.id_of[f"{grad}/Conv2DBackpropFilter"], \
        ix.id_of[f"{grad}/Conv2DBackpropInput"]
    assert weights in ix.control_inputs[inputs]  # the weight gradient first
    late = {}  # copy of the first layer's output -> its readers
    for i, name in enumerate(ix.names):
        if is_copy(name) and original_name(name) == FIRST and "_late" in name.rsplit("/", 1)[1]:
            late[i] = set(ix.data_consumers(i))
    assert len(late) == 2, [ix.names[i] for i in late]
    mine = [c for c, readers in late.items() if weights in readers]
    assert len(mine) == 1 and late[mine[0]] == {weights}
    (other,) = set(late) - set(mine)
    assert any(ix.ops[r] == "ReluGrad" for r in late[other])
    # the second copy waits for both gradient ops of the next layer: the first is free
    assert {weights, inputs} <= ix.ancestors([other])
    assert not ix.ancestors([mine[0]]) & {weights, inputs}
    r = verify(str(wide_first), str(out), RunSpec(batch_size=BATCH, grappler=False), 3,
               0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches
    r = verify(str(wide_first), str(out), RunSpec(batch_size=BATCH), 3, 1e-4, 1e-5)
    assert r.same_training, r.mismatches


def test_the_split_lowers_the_estimated_peak(wide_first, tmp_path, monkeypatch):
    from graphmem.passes.pool_first import PoolFirstPass

    # weighed without pooling gradients first (pool_first.py), which free block 1's pooled
    # input earlier: on this small network the allocator replay then hands a 4 MiB copy a
    # larger chunk at the peak (14.4 against 11.3 MB, the same tensors live), which hides
    # what the split does
    monkeypatch.setattr(PoolFirstPass, "applies", lambda self, context: False)
    split = _rewrite(wide_first, tmp_path / "a.meta", monkeypatch, split=True)
    whole = _rewrite(wide_first, tmp_path / "b.meta", monkeypatch, split=False)
    assert whole.plan.order_edges == 0
    assert split.after.peak_bytes < whole.after.peak_bytes
