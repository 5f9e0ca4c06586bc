"""Statistics kept, not recomputed (recompute.py, _small_reductions): an unfused batch
norm's mean and variance (per channel), and what is computed from them alone (the scale and
offset), stay alive to the backward pass; the copies start after them. Recomputing them ran
a memory-bound mean, a full-size squared difference and a second mean per layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmem.formats import load_model
from graphmem.graph.names import is_copy
from graphmem.graph.workspace import Workspace
from graphmem.rewrite import RewriteOptions, rewrite_file
from graphmem.runtime.train_runner import RunSpec
from graphmem.runtime.verify import verify
from tests.test_fusion_guard import biased_convnet

pytestmark = pytest.mark.tf

BATCH = 8


@pytest.fixture(scope="module")
def bn_net(tmp_path_factory) -> Path:
    return biased_convnet(tmp_path_factory.mktemp("bn") / "bn.meta", (16, 16, 32, 32),
                          unfused_bn=True)


def _copied_ops(path: Path) -> list[str]:
    ix = Workspace.open(load_model(str(path))).index
    return [ix.ops[i] for i, name in enumerate(ix.names)
            if is_copy(name)]


def test_statistics_are_kept_and_training_is_the_same(bn_net, tmp_path):
    out = tmp_path / "out.meta"
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    result = rewrite_file(bn_net, out, options)
    copied = _copied_ops(out)
    assert "Conv2D" in copied  # the segments are recomputed ...
    # ... from kept statistics: no mean, no squared difference, no reciprocal root
    assert not {"Mean", "SquaredDifference", "Rsqrt"} & set(copied), copied
    assert result.plan.cycle_breaks == 0
    # the saved means, variances and scales of the four layers, at least
    assert result.plan.kept_statistics >= 8
    from graphmem.report.rewrite_report import rewrite_document

    assert rewrite_document(result, str(out))["kept_statistics"] == result.plan.kept_statistics
    r = verify(str(bn_net), str(out), RunSpec(batch_size=BATCH, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches


def test_without_the_rule_the_statistics_were_recomputed(bn_net, tmp_path, monkeypatch):
    """The contrast that makes the first test mean something: the same plan, the rule off."""
    import graphmem.passes.recompute as rc

    monkeypatch.setattr(rc, "_small_reductions", lambda *a: set())
    out = tmp_path / "out.meta"
    options = RewriteOptions("names", ["MaxPool"], BATCH)
    options.keep_worse = True
    rewrite_file(bn_net, out, options)
    copied = _copied_ops(out)
    assert {"Mean", "SquaredDifference"} <= set(copied), copied
