"""Tiny hand-built GraphDefs for tests that need no TensorFlow."""

from __future__ import annotations

from graphmem import protos
from graphmem.graph.index import GraphIndex
from graphmem.graph.opdefs import OpRegistry

FLOAT = 1


class G:
    def __init__(self) -> None:
        self.graph_def = protos.GraphDef()

    def op(self, name: str, op: str, *inputs: str, shape=(4,), device: str = "",
           n_out: int = 1, dtype: int = FLOAT, **attrs):
        node = self.graph_def.node.add(name=name, op=op, device=device)
        node.input.extend(inputs)
        node.attr["T"].type = dtype
        shp = node.attr["_output_shapes"].list
        for _ in range(n_out):
            s = shp.shape.add()
            if shape is None:
                s.unknown_rank = True
            else:
                for d in shape:
                    s.dim.add(size=d)
        for key, value in attrs.items():
            if isinstance(value, bytes):
                node.attr[key].s = value
        return node

    def relu_loss(self, inp: str, shape, scope: str = "gradients", dy: str = "dy") -> str:
        """`act = Relu(inp)`, a scalar loss summed from it, and the loss's gradient back
        through the Relu (`{scope}/{dy}`, returned): the start of a backward pass."""
        self.op("act", "Relu", inp, shape=shape)
        self.op("loss", "Sum", "act", shape=())
        self.op(f"{scope}/seed", "Fill", "loss", shape=())
        self.op(f"{scope}/{dy}", "ReluGrad", f"{scope}/seed", "act", shape=shape)
        return f"{scope}/{dy}"

    def index(self) -> GraphIndex:
        return GraphIndex.build(self.graph_def, OpRegistry(use_tensorflow=False))
