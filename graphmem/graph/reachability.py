"""Does op `v` depend on op `u`? Answered per pair without a set per op.

A pass that asks this for a few pairs near each of thousands of ops cannot afford one
ancestor set (or bitmask) per op: that grows as nodes x queries. GRAIL (Yildirim et al.,
VLDB 2010) labels each op with intervals from a few depth-first traversals, in linear time;
if `v` is reachable from `u`, every interval of `v` lies inside `u`'s, so most "no" answers
take a comparison, and a search for a "yes" skips every op whose intervals rule it out.

Long paths are what such a search cannot afford: a forward op and a weight update are
linked through the whole rest of the forward pass and most of the backward pass. Callers
name up to eight landmarks (for a training step, the forward ops nearest the loss); two
sweeps mark, with a bit per landmark in a byte per op, which landmarks each op reaches and
is reached from, so `u -> landmark -> v` settles a long "yes" in constant time.

Loop back edges (NextIteration -> Merge) are left out, as in the index's topological order:
answers are about the graph without them, so a "no" for ops inside a v1 loop body is not a
proof, and callers must not rely on one there.
"""

from __future__ import annotations

from collections import deque

from graphmem.graph.index import GraphIndex

MAX_LANDMARKS = 8  # one bit each in a byte per op


class Reachability:
    def __init__(self, index: GraphIndex, landmarks: list[int] = (), traversals: int = 1
                 ) -> None:
        self.index = index
        n = len(index)
        control_inputs = index.control_inputs
        # the loops' back edges left out
        pairs = zip(index.ordering_data_inputs(), control_inputs, strict=True)
        preds = [[t[0] for t in data] + ctrl for data, ctrl in pairs]
        succ: list[list[int]] = [[] for _ in range(n)]
        for i, p in enumerate(preds):  # each op's successors in increasing id order
            for s in p:
                succ[s].append(i)
        self.succ = succ
        self.preds = preds
        self.allowance = 20 * n + 100_000
        marks = list(dict.fromkeys(landmarks))[:MAX_LANDMARKS]
        # per op, a bitmask: which landmarks it reaches, and which reach it (one sweep each
        # way in topological order, each op handing its final mask on to its neighbours;
        # back edges are absent from succ and preds). Ops placed after every landmark reach
        # none, and ops placed before all of them are reached by none: the sweeps start at
        # the landmarks, and skip the ops with an empty mask
        self.to_landmark = to_mark = bytearray(n)
        self.from_landmark = from_mark = bytearray(n)
        for b, m in enumerate(marks):
            to_mark[m] = from_mark[m] = 1 << b
        topo, position = index.topo, index.position
        if marks:
            for i in reversed(topo[:max(position[m] for m in marks) + 1]):
                m = to_mark[i]
                if m:
                    for j in preds[i]:
                        to_mark[j] |= m
            for i in topo[min(position[m] for m in marks):]:
                m = from_mark[i]
                if m:
                    for j in succ[i]:
                        from_mark[j] |= m
        self.labels = [_intervals(succ, topo, flip=bool(t % 2)) for t in range(traversals)]

    def may_reach(self, u: int, v: int) -> bool:
        """False only when no path u -> v exists (the interval test)."""
        for low, rank in self.labels:
            if not (low[u] <= low[v] and rank[v] <= rank[u]):
                return False
        return True

    def reaches(self, u: int, v: int, budget: int = 5_000) -> bool | None:
        """Whether a path u -> v exists; None when the search would visit more than
        `budget` ops, or the index's allowance for all searches (a few times the node
        count, so a pass asking many questions stays linear) is spent.

        The search runs breadth first backwards from `v`: the ops asked about are usually
        a few edges apart, and going forwards from `u` would first wander down every path
        to the end of the graph."""
        if u == v:
            return True
        for low, rank in self.labels:  # may_reach, inline: asked of every pair
            if not (low[u] <= low[v] and rank[v] <= rank[u]):
                return False
        if self.to_landmark[u] & self.from_landmark[v]:
            return True  # u -> landmark -> v
        if self.allowance <= 0:
            return None
        position = self.index.position
        floor = position[u]
        preds = self.preds
        seen = {v}
        queue = deque([v])
        try:
            while queue:
                i = queue.popleft()
                for j in preds[i]:
                    if j == u:
                        return True
                    if j in seen or position[j] < floor or not self.may_reach(u, j):
                        continue
                    if len(seen) >= budget:
                        return None
                    seen.add(j)
                    queue.append(j)
            return False
        finally:
            self.allowance -= len(seen)


def _intervals(succ: list[list[int]], topo: list[int], flip: bool) -> tuple[list[int], list[int]]:
    """One depth-first traversal: post-order rank of each op, and the lowest rank among
    everything reachable from it. Roots are taken in topological order (or reversed), and
    children in list order (or reversed), so two traversals differ.

    The stack holds ops to enter and, as ~op, ops to finish: entering an op pushes its
    finish, then all its children (the first to be entered on top). A child found entered
    when it comes up is skipped, so ops are entered in the order of the recursive search,
    and the graph being acyclic, every child is finished before its parent."""
    n = len(succ)
    rank = [-1] * n  # -2: entered, not finished
    low = [0] * n
    counter = 0
    stack: list[int] = []
    push, pop, extend = stack.append, stack.pop, stack.extend
    for root in reversed(topo) if flip else topo:
        if rank[root] != -1:
            continue
        push(root)
        while stack:
            i = pop()
            if i < 0:
                i = ~i
                lowest = counter
                for j in succ[i]:
                    if low[j] < lowest:
                        lowest = low[j]
                rank[i] = counter
                low[i] = lowest
                counter += 1
            elif rank[i] == -1:
                rank[i] = -2
                push(~i)
                extend(succ[i] if flip else reversed(succ[i]))
    return low, rank
