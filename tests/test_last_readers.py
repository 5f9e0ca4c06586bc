"""Last readers write in place (passes/last_readers.py): of the backward readers of a large
tensor, an element-wise one runs last, so that TF hands it the tensor's buffer. Found on
Keras MobileNetV2 (issue 21): an unfused batch norm's gradient reads `dy` three times, and
`dy * scale` got a full-size buffer of its own while `dy` lived on for the other two."""

from __future__ import annotations

from pathlib import Path

import pytest

from graphmem.analysis.regions import analyze_regions
from graphmem.passes.last_readers import MIN_BYTES, apply_last_readers
from tests.graphbuilder import G


def _batch_norm_gradient(side: int, late_reader: bool = False) -> G:
    """`dy` read by the offset's Sum, `dy * x` (the scale's gradient, summed) and
    `dy * scale` (dx), as Keras' unfused batch norm's gradient reads it. With
    `late_reader`, a fourth reader also needs a value made from dy (after it)."""
    big = (side, side)
    g = G()
    g.op("x", "Placeholder", shape=big)
    g.op("scale", "Placeholder", shape=(side,))
    g.relu_loss("x", big, "gradient_tape")
    g.op("gradient_tape/dbeta", "Sum", "gradient_tape/dy", shape=(side,))
    g.op("gradient_tape/dx", "Mul", "gradient_tape/dy", "scale", shape=big)
    g.op("gradient_tape/dyx", "Mul", "x", "gradient_tape/dy", shape=big)
    g.op("gradient_tape/dgamma", "Sum", "gradient_tape/dyx", shape=(side,))
    out = ["gradient_tape/dx", "gradient_tape/dx"]
    if late_reader:
        g.op("gradient_tape/late", "Neg", "gradient_tape/dbeta", shape=(side,))
        g.op("gradient_tape/mm", "MatMul", "gradient_tape/dy", "gradient_tape/late", shape=big)
        out[1] = "gradient_tape/mm"
    g.op("gradient_tape/out", "AddN", *out, shape=big)
    for v, grad in (("beta", "gradient_tape/dbeta"), ("gamma", "gradient_tape/dgamma"),
                    ("w", "gradient_tape/out")):
        g.op(v, "VarHandleOp", shape=())
        g.op(f"apply_{v}", "ResourceApplyGradientDescent", v, grad, shape=())
    return g


def _waits_for(index, name: str) -> set[str]:
    return {index.names[c] for c in index.control_inputs[index.id_of[name]]}


def test_the_last_element_wise_reader_waits_for_the_others():
    index = _batch_norm_gradient(1024).index()
    plan = apply_last_readers(index, analyze_regions(index), None)
    assert plan.tensors == 1 and plan.bytes == 1024 * 1024 * 4
    # of the two products, the one later in topological order takes dy's buffer
    assert _waits_for(index, "gradient_tape/dyx") == {"gradient_tape/dbeta", "gradient_tape/dx"}
    assert _waits_for(index, "gradient_tape/dx") == set()


def test_small_tensors_and_readers_that_wait_for_later_ops_are_left_alone():
    side = 256  # 256 KiB: below the size worth an edge
    assert side * side * 4 < MIN_BYTES
    index = _batch_norm_gradient(side).index()
    assert apply_last_readers(index, analyze_regions(index), None).tensors == 0
    # a reader that also needs a value made after dy (from dy's own Sum): making the
    # product wait for it could hold it back behind the chain that makes that value
    index = _batch_norm_gradient(1024, late_reader=True).index()
    assert apply_last_readers(index, analyze_regions(index), None).tensors == 0


@pytest.mark.tf
def test_a_rewrite_with_last_readers_trains_the_same(tmp_path_factory):
    from graphmem.rewrite import RewriteOptions, rewrite_file
    from graphmem.runtime.train_runner import RunSpec
    from graphmem.runtime.verify import verify
    from tests.test_fusion_guard import biased_convnet

    batch = 8
    src = biased_convnet(tmp_path_factory.mktemp("lr") / "bn.meta", (16, 16, 32, 32),
                         side=64, unfused_bn=True)
    out = Path(tmp_path_factory.mktemp("lr_out")) / "out.meta"
    options = RewriteOptions("none", [], batch)
    options.keep_worse = True
    result = rewrite_file(src, out, options)
    # the batch norms of the 64 x 64 layers (2 MiB at batch 8): their dy
    assert result.early.last_readers >= 2, result.early
    r = verify(str(src), str(out), RunSpec(batch_size=batch, grappler=False), 3, 0.0, 0.0)
    assert r.same_training and r.max_variable_diff == 0, r.mismatches
