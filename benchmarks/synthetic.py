"""Synthetic TF1-style training graphs, built as protos without TensorFlow.

They mirror what `tf.gradients` + an optimizer write (forward chain, `gradients/` scope with
per-layer grad ops, one apply op per variable, a train NoOp) so the tool's own cost can be
timed on 10k-1M node graphs. `residual=True` adds a skip every two layers; `branches > 1`
makes each layer a fan of parallel matmuls joined by AddN.
"""

from __future__ import annotations

from graphmem import protos

FLOAT = 1


def _node(g, name, op, inputs=(), shape=None, n_out=1):
    node = g.node.add(name=name, op=op)
    node.input.extend(inputs)
    node.attr["T"].type = FLOAT
    if shape is not None:
        lst = node.attr["_output_shapes"].list
        for _ in range(n_out):
            s = lst.shape.add()
            for d in shape:
                s.dim.add(size=d)
    return node


def _variable(g, name, shape):
    v = _node(g, name, "VariableV2", shape=shape)
    v.attr["dtype"].type = FLOAT
    for d in shape:
        v.attr["shape"].shape.dim.add(size=d)
    _node(g, f"{name}/read", "Identity", [name], shape)
    return name


def chain_training_graph(layers: int, width: int = 64, batch: int = 32,
                         residual: bool = False, branches: int = 1):
    g = protos.GraphDef()
    act = [batch, width]
    _node(g, "x", "Placeholder", shape=act).attr["dtype"].type = FLOAT
    h = "x"
    weights = []
    outs = []  # (input tensor of layer, matmul outputs, relu output)
    for i in range(layers):
        s = f"layer_{i}"
        mms = []
        for b in range(branches):
            w = _variable(g, f"{s}/w{b}", [width, width])
            weights.append(w)
            _node(g, f"{s}/MatMul{b}", "MatMul", [h, f"{w}/read"], act)
            mms.append(f"{s}/MatMul{b}")
        pre = mms[0]
        if branches > 1:
            _node(g, f"{s}/AddN", "AddN", mms, act)
            pre = f"{s}/AddN"
        if residual and i % 2 == 1:
            _node(g, f"{s}/skip", "AddV2", [pre, outs[i - 1][0]], act)
            pre = f"{s}/skip"
        _node(g, f"{s}/Relu", "Relu", [pre], act)
        outs.append((h, mms, f"{s}/Relu", pre))
        h = f"{s}/Relu"
    _node(g, "loss", "Sum", [h, "loss/axes"], [])
    _node(g, "loss/axes", "Const", shape=[2])
    _node(g, "gradients/Shape", "Const", shape=[0])
    _node(g, "gradients/grad_ys_0", "Fill", ["gradients/Shape"], [])
    _node(g, "gradients/loss_grad/Tile", "BroadcastTo", ["gradients/grad_ys_0", "x"], act)
    grad = "gradients/loss_grad/Tile"
    pending_skip: dict[int, str] = {}
    applies = []
    for i in reversed(range(layers)):
        s = f"gradients/layer_{i}"
        h_in, mms, relu, pre = outs[i]
        if i in pending_skip:
            _node(g, f"{s}/skip_sum", "AddN", [grad, pending_skip.pop(i)], act)
            grad = f"{s}/skip_sum"
        _node(g, f"{s}/ReluGrad", "ReluGrad", [grad, relu], act)
        g_pre = f"{s}/ReluGrad"
        if residual and i % 2 == 1:
            pending_skip[i - 1] = g_pre
        dxs = []
        for b in range(len(mms)):
            w = f"layer_{i}/w{b}"
            _node(g, f"{s}/MatMul{b}_grad/dx", "MatMul", [g_pre, f"{w}/read"], act)
            _node(g, f"{s}/MatMul{b}_grad/dw", "MatMul", [h_in, g_pre], [width, width])
            dxs.append(f"{s}/MatMul{b}_grad/dx")
            ap = _node(g, f"GradientDescent/update_{w}/ApplyGradientDescent",
                       "ApplyGradientDescent", [w, "GradientDescent/lr", f"{s}/MatMul{b}_grad/dw"],
                       [width, width])
            applies.append(ap.name)
        grad = dxs[0]
        if len(dxs) > 1:
            _node(g, f"{s}/dx_sum", "AddN", dxs, act)
            grad = f"{s}/dx_sum"
    _node(g, "GradientDescent/lr", "Const", shape=[])
    _node(g, "GradientDescent", "NoOp", ["^" + a for a in applies], None)
    return g
