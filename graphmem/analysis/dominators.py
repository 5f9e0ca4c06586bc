"""Bottlenecks of the forward pass: ops every path from the inputs to the loss goes through.

Immediate dominators on a DAG follow from one pass in topological order (Cooper, Harvey and
Kennedy's intersection, which needs no iteration when predecessors come first). The
dominators of the sink are the bottlenecks, read off the dominator tree by walking up from it.
"""

from __future__ import annotations

from collections.abc import Iterable

SOURCE = -1


def immediate_dominators(order: list[int], preds: dict[int, list[int]]) -> dict[int, int]:
    """idom of every node of a DAG given in topological `order`; roots hang off SOURCE."""
    idom: dict[int, int] = {}
    depth: dict[int, int] = {SOURCE: 0}
    for v in order:
        ps = [p for p in preds.get(v, ()) if p in idom]
        if not ps:
            idom[v] = SOURCE
        else:
            d = ps[0]
            for p in ps[1:]:
                d = _intersect(d, p, idom, depth)
            idom[v] = d
        depth[v] = depth[idom[v]] + 1
    return idom


def _intersect(a: int, b: int, idom: dict[int, int], depth: dict[int, int]) -> int:
    while a != b:
        da, db = depth[a], depth[b]
        if da >= db:
            a = idom[a] if a != SOURCE else a
        if db >= da:
            b = idom[b] if b != SOURCE else b
    return a


def dominators_of(node: int, idom: dict[int, int]) -> list[int]:
    """Strict dominators of `node`, nearest first."""
    out = []
    v = idom.get(node, SOURCE)
    while v != SOURCE:
        out.append(v)
        v = idom[v]
    return out


def bottlenecks(order: list[int], edges: Iterable[tuple[int, int]], sinks: list[int]) -> list[int]:
    """Nodes on every path from a root of the DAG to the sinks, in topological order."""
    preds: dict[int, list[int]] = {}
    for a, b in edges:
        preds.setdefault(b, []).append(a)
    members = set(order)
    sink = sinks[0] if len(sinks) == 1 else None
    if sink is None:
        # several sinks: join them with a virtual node that comes last
        virtual = max(members, default=0) + 1
        preds[virtual] = [s for s in sinks if s in members]
        order = order + [virtual]
        sink = virtual
    idom = immediate_dominators(order, preds)
    pos = {v: p for p, v in enumerate(order)}
    return sorted(dominators_of(sink, idom), key=pos.__getitem__)
