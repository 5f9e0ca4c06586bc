"""benchmarks/op_class_times.py's arithmetic: op types (the graph's and the profiler's
kernel names) to classes, and each class's price per modelled unit against forward
convolutions'."""

from __future__ import annotations

import pytest

from benchmarks.op_class_times import ClassTimes, op_class


@pytest.mark.parametrize(("op_type", "cls"), [
    ("Conv2D", "conv_forward"),
    ("_MklNativeFusedConv2D", "conv_forward"),
    ("_MklNativePadWithFusedConv2D", "conv_forward"),
    ("DepthwiseConv2dNative", "conv_forward"),
    ("Conv2DBackpropFilter", "filter_gradient"),
    ("_MklNativeConv2DBackpropFilterWithBias", "filter_gradient"),
    ("DepthwiseConv2dNativeBackpropFilter", "filter_gradient"),
    ("Conv2DBackpropInput", "input_gradient"),
    ("_MklNativeFusedMatMul", "matmul"),
    ("FusedBatchNormV3", "batch_norm"),
    ("FusedBatchNormGradV3", "batch_norm_gradient"),
    ("_MklNativeMaxPoolGrad", "pooling"),
    ("SquaredDifference", "other"),
])
def test_op_types_fall_in_their_class(op_type, cls):
    assert op_class(op_type) == cls


def test_price_per_unit_is_relative_to_forward_convolutions():
    # convolutions: 2 s for 100 units; filter gradients 3 s for 100 (1.5x the price);
    # batch norm 1 s for 10 (5x); a class the model has no units for gets no price
    t = ClassTimes({"conv_forward": 2.0, "filter_gradient": 3.0, "batch_norm": 1.0,
                    "pooling": 0.5},
                   {"conv_forward": 100.0, "filter_gradient": 100.0, "batch_norm": 10.0})
    rows = {c: (m, ms, us, rel) for c, m, ms, us, rel in t.rows()}
    assert rows["filter_gradient"][3] == pytest.approx(1.5)
    assert rows["batch_norm"][3] == pytest.approx(5.0)
    assert rows["conv_forward"][3] == pytest.approx(1.0)
    assert rows["pooling"][3] is None
    assert rows["filter_gradient"][1] == pytest.approx(3.0 / 6.5)  # measured share
    assert rows["batch_norm"][2] == pytest.approx(10.0 / 210.0)  # modelled share
    assert list(rows) == ["conv_forward", "filter_gradient", "batch_norm", "pooling"]
