"""Pooling gradient first: mask the incoming gradient at the pooled size, then scatter it.

TF's gradient of `relu -> max pool` is `ReluGrad(MaxPoolGrad(x, pool, dp), x)`: the pooling
gradient writes a buffer of x's size, and the ReLU gradient then reads it *and* x, so the
pooling gradient runs with x, its own output, the pooled value, the incoming gradient and
(on Eigen's kernels) the int64 argmax of every pooled value live together. On VGG at 224 px,
batch 32, that is 392 + 392 + 98 + 98 + 196 MiB at block 1: the floor of every plan.

The same values come from `MaxPoolGrad(x, pool, ReluGrad(dp, pool))`. The pooling gradient
adds each pooled position's gradient into the input position its window's maximum came
from, so every term that reaches an input position p has `pool[w] == x[p]`, and masking the
term by `pool[w] > 0` masks it as the ReLU gradient masks the sum by `x[p] > 0`: the same
terms, added in the same order, each kept or dropped together. (Only the sign of a zero can
differ: where a negative gradient meets x == 0 the original writes -0.0, the rewrite +0.0;
every value compares equal, and a zero's sign changes no sum, product or update that reads
it.) x is then read by the pooling gradient alone, which TF's CPU kernel takes over as its
output (`forward_input_or_allocate_output({0}, ...)`): one x-sized buffer fewer at the
peak. NaN inputs aside (a window whose maximum is NaN).

A site qualifies when the ReLU gradient's features are the pooling gradient's input x, the
pooling gradient feeds nothing else, its pooled value is a MaxPool of x (or of the tensor
x copies: recompute copies compute the same bits) with the same window, strides, padding
and layout, and x is at least MIN_BYTES. Runs after the recompute pass (whose plans name
tensors of the original graph); ops waiting on the old pair wait on the new pooling
gradient. New nodes are appended and readers rewired; the old pair is left unread (TF
prunes it, and so does the estimate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphmem.analysis.regions import Regions
from graphmem.graph.builders import redirect_readers, unique_name
from graphmem.graph.index import GraphIndex, Tensor
from graphmem.graph.names import input_string, is_hold, original_name
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan

SCOPE = "graphmem_pool_first"
MIN_BYTES = 1 << 20  # smaller inputs are not worth two nodes
_WINDOW_ATTRS = ("ksize", "strides", "padding", "data_format", "explicit_paddings")


@dataclass
class PoolFirstPlan(PassPlan):
    pools: list[str] = field(default_factory=list)  # the pooling gradients now masked first
    bytes: int = 0  # their inputs' sizes, summed: buffers the pooling gradients write into

    @property
    def changed(self) -> bool:
        return bool(self.pools)


@dataclass
class PoolSite:
    relu_grad: int
    pool_grad: int
    pooled: Tensor  # the MaxPool's output the pooling gradient reads
    grad: Tensor  # the gradient of the pooled value
    bytes: int  # x's size


def _origin(index: GraphIndex, t: Tensor) -> tuple[str, int]:
    """The tensor a recompute copy, or the Identity holding copies back, stands for
    (itself when it is neither)."""
    while is_hold(index.names[t[0]]) and index.data_inputs[t[0]]:
        t = index.data_inputs[t[0]][0]
    return original_name(index.names[t[0]]), t[1]


def _window(index: GraphIndex, i: int) -> list[bytes | None]:
    attrs = index.node(i).attr
    return [attrs[a].SerializeToString() if a in attrs else None for a in _WINDOW_ATTRS]


def pool_sites(index: GraphIndex, regions: Regions, batch_size: int | None) -> list[PoolSite]:
    """The `ReluGrad(MaxPoolGrad(x, MaxPool(x), dp), x)` pairs of the step (see above)."""
    step = regions.step_nodes(index)
    sizes = index.output_bytes(batch_size)
    ops, data_inputs = index.ops, index.data_inputs
    sites = []
    for r in sorted(step):
        if ops[r] != "ReluGrad" or len(data_inputs[r]) != 2:
            continue
        (m, k), x = data_inputs[r]
        if k != 0 or ops[m] != "MaxPoolGrad" or m not in step:
            continue
        ins = data_inputs[m]
        if len(ins) != 3 or ins[0] != x or set(index.data_consumers(m)) != {r} or \
                index.control_consumers[m] or index.devices[m] != index.devices[r]:
            continue
        pooled, grad = ins[1], ins[2]
        q = pooled[0]
        if ops[q] != "MaxPool" or pooled[1] != 0 or not data_inputs[q] or \
                _origin(index, data_inputs[q][0]) != _origin(index, x) or \
                _window(index, q) != _window(index, m):
            continue
        b = sizes(x[0])[x[1]] if x[1] < len(sizes(x[0])) else None
        if b is None or b < MIN_BYTES:
            continue
        sites.append(PoolSite(r, m, pooled, grad, b))
    return sites


def apply_pool_first(index: GraphIndex, sites: list[PoolSite]) -> PoolFirstPlan:
    """Edit `index.graph_def` for each site (the caller re-indexes)."""
    plan = PoolFirstPlan()
    g = index.graph_def
    names = index.names
    taken = set(index.id_of)
    replaced: dict[str, str] = {}  # old ReluGrad or MaxPoolGrad -> the new MaxPoolGrad
    for s in sites:
        relu_node, pool_node = g.node[s.relu_grad], g.node[s.pool_grad]
        base = unique_name(f"{pool_node.name}/{SCOPE}", taken.__contains__)
        taken.add(base)
        waits = [t for t in [*pool_node.input, *relu_node.input] if t.startswith("^")]
        masked = g.node.add()
        masked.CopyFrom(relu_node)
        masked.name = f"{base}/relu_grad"
        del masked.input[:]
        masked.input.extend([input_string(names[s.grad[0]], s.grad[1]),
                             input_string(names[s.pooled[0]], s.pooled[1]),
                             *dict.fromkeys(t for t in pool_node.input if t.startswith("^"))])
        shapes = index.node(s.pooled[0]).attr.get("_output_shapes")
        if shapes is not None and len(shapes.list.shape) > s.pooled[1]:
            out = masked.attr["_output_shapes"].list.shape
            del out[:]
            out.add().CopyFrom(shapes.list.shape[s.pooled[1]])
        elif "_output_shapes" in masked.attr:
            del masked.attr["_output_shapes"]
        scatter = g.node.add()
        scatter.CopyFrom(pool_node)
        scatter.name = f"{base}/max_pool_grad"
        del scatter.input[:]
        data = [t for t in pool_node.input if not t.startswith("^")]
        scatter.input.extend([data[0], data[1], masked.name, *dict.fromkeys(waits)])
        replaced[relu_node.name] = replaced[pool_node.name] = scatter.name
        plan.pools.append(pool_node.name)
        plan.bytes += s.bytes
    if not replaced:
        return plan
    redirect_readers(index, (i for s in sites for i in (s.relu_grad, s.pool_grad)), replaced)
    return plan


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class PoolFirstPass(Pass):
    """A max pooling's gradient masks the incoming gradient first, then scatters it into
    the pooled input's own buffer (with early updates: the in-place family of passes)."""

    name, edits = "pool first", Edits.NODES

    def enabled(self, options) -> bool:
        return options.early_updates

    def applies(self, context: PassContext) -> bool:
        return "MaxPoolGrad" in context.index.ops

    def run(self, context: PassContext) -> PoolFirstPlan:
        index = context.index
        return apply_pool_first(index, pool_sites(index, context.regions,
                                                  context.options.batch_size))
