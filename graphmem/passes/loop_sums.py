"""Running sums in control-flow-v1 gradient loops: each iteration's term waits for the sum.

Why: a loop-invariant weight (an LSTM kernel) gets its gradient summed over the iterations
in a loop variable of the gradient loop (`Merge(Enter(zeros), NextIteration(Add(sum,
term)))`). The term of iteration k (`h^T . d_gates`, kernel-sized) needs nothing from the
sum, so with `parallel_iterations` the executor runs iterations ahead and their terms wait
for the Add one after the other: measured on a v1 LSTM (64 steps x 256 units) at one
inter-op thread, 100 MiB against 61 MiB when the graph's order happens not to run ahead,
and any rewrite that perturbs the order can tip a graph from one to the other. A control
edge from the iteration's sum to the term's op keeps one term alive at a time.

Only the order changes. The edge runs inside one iteration of one frame: from a new
Identity of the body side of the sum's Switch (a control edge straight from a Switch would
carry the deadness of its other branch) to the op that makes the term, past the Identities of
TF's gradient tuples; it depends on the sum only through the loop's back edge: no cycle, and
no deadness an op of the body does not have already (both are dead exactly when the loop
exits). Adds nodes: the driver re-indexes after it.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphmem.graph.dtypes import FLOATS
from graphmem.graph.index import SUM_OPS, GraphIndex
from graphmem.passes.base import Edits, Pass, PassContext, PassPlan


@dataclass
class LoopSumsPlan(PassPlan):
    held: int = 0  # gradient-loop terms made to wait for the running sum

    @property
    def changed(self) -> bool:
        return self.held > 0


def hold_loop_sums(index: GraphIndex) -> int:
    """Edit index.graph_def (the index is stale afterwards); returns how many terms wait."""
    if not any(index.frame):
        return 0
    ops = index.ops
    g = index.graph_def
    held = 0
    for n in range(len(index)):
        if ops[n] not in ("NextIteration", "RefNextIteration") or not index.data_inputs[n]:
            continue
        add = index.through_identity(index.data_inputs[n][0][0])
        switch = _switch_of(index, n)
        if switch is None or ops[add] not in SUM_OPS or index.frame[add] != index.frame[switch]:
            continue
        if (index.dtype((add, 0)) or 0) not in FLOATS:
            continue
        ins = index.data_inputs[add]
        if sum(index.through_identity(s) == switch and k == 1 for s, k in ins) != 1:
            continue  # not a running sum of this loop variable
        terms = [index.through_identity(s) for s, k in ins
                 if not (index.through_identity(s) == switch and k == 1)]
        terms = [p for p in terms if index.frame[p] == index.frame[add]
                 and ops[p] not in _NOT_TERMS and not index.stateful[p]]
        if not terms:
            continue
        wait = g.node.add(name=f"{index.names[switch]}/graphmem_sum_wait", op="Identity",
                          device=index.devices[switch])
        wait.input.append(f"{index.names[switch]}:1")
        wait.attr["T"].type = index.dtype((switch, 1)) or index.dtype((add, 0))
        for p in terms:
            g.node[p].input.append("^" + wait.name)
            held += 1
    return held


_NOT_TERMS = frozenset({"Enter", "RefEnter", "Merge", "RefMerge", "Switch", "RefSwitch",
                        "Const", "NextIteration", "RefNextIteration", "Exit", "RefExit"})


def _switch_of(index: GraphIndex, next_iteration: int) -> int | None:
    """The Switch that hands this loop variable to the body (Merge -> Switch)."""
    merges = [c for c in index.data_consumers(next_iteration)
              if index.ops[c] in ("Merge", "RefMerge")]
    if len(merges) != 1:
        return None
    switches = [c for c in index.data_consumers(merges[0])
                if index.ops[c] in ("Switch", "RefSwitch")]
    return switches[0] if len(switches) == 1 else None


# ---- the pass, under the pipeline's contract (base.py) ---------------------------------
class LoopSumsPass(Pass):
    """In v1 gradient loops, each iteration's weight-gradient term waits for the running
    sum, so iterations do not run ahead holding their terms (before early updates)."""

    name, edits = "loop sums", Edits.NODES

    def enabled(self, options) -> bool:
        return options.early_updates

    def run(self, context: PassContext) -> LoopSumsPlan:
        return LoopSumsPlan(hold_loop_sums(context.index))
