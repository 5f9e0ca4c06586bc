"""The pass contract: what a rewrite pass declares, what it is given, what it returns.

A pass is an object with a `name`, the options under which it runs (`enabled`), what it
edits (`edits`: nodes, or control edges only) and `run(context) -> plan`. The pipeline
(pipeline.py) runs the passes in their declared order and keeps the context's index and
regions up to date from those declarations alone: after a pass that edited nodes it
re-indexes (which also proves the graph still acyclic) and analyses the regions again
only when a later pass, or the caller, asks for them.

A plan is a dataclass of the pass's own fields (the report presents them) that also
answers the two questions every plan answers (`PassPlan`): did the pass change the graph,
and what did it leave alone and why.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from graphmem.analysis.regions import Regions, analyze_regions
from graphmem.graph.index import GraphIndex, Tensor, closing_cycles
from graphmem.graph.workspace import Workspace

if TYPE_CHECKING:
    from graphmem.analysis.activations import ForwardFacts
    from graphmem.passes.checkpoints import CheckpointChoice


class Edits(enum.Enum):
    """What a pass changes, which decides what the pipeline must rebuild after it."""

    # appends nodes and edits inputs (never removes or reorders: re-indexing reuses the
    # per-node facts of the nodes it had): index and regions are stale after it
    NODES = "nodes"
    # adds or removes control edges in the graph and the index in place
    # (`add_control_edges`, `remove_control_edges`): node ids stay, and the regions stay
    # what the estimate reads
    CONTROL_EDGES = "control edges"
    # sets attributes of nodes in place: ids, edges and regions stay
    ATTRS = "attrs"


def add_edge_groups(index: GraphIndex, edges: dict) -> list[tuple[int, int]]:
    """Add the control edges of `edges` (key -> its (source, destination) pairs) to the
    graph and the index in place, less the groups that would close a cycle, alone or with
    the others (deleted from `edges`). Returns the edges added."""
    for key in closing_cycles(index, edges):
        del edges[key]
    added = [e for group in edges.values() for e in group]
    add_edges(index, added)
    return added


def add_edges(index: GraphIndex, edges: list[tuple[int, int]]) -> None:
    """Add the control edges (source, destination) to the graph and the index in place,
    unchecked: for edges known to close no cycle (ones a pass removed and puts back)."""
    for src, dst in edges:
        index.graph_def.node[dst].input.append("^" + index.names[src])
    if edges:
        index.add_control_edges(edges)


def skip(plan: PassPlan, why: str) -> None:
    """Count one thing a pass left alone under the reason it gives (`plan.skipped`: why ->
    count, which the reports list)."""
    plan.skipped[why] = plan.skipped.get(why, 0) + 1


def remove_edges(index: GraphIndex, edges: list[tuple[int, int]]) -> None:
    """Remove the control edges (source, destination) from the graph and the index in
    place (removing edges keeps every topological order valid)."""
    g = index.graph_def
    for u, v in edges:
        node = g.node[v]
        text = "^" + index.names[u]
        kept = [x for x in node.input if x != text]
        del node.input[:]
        node.input.extend(kept)
    if edges:
        index.remove_control_edges(edges)


class PassPlan:
    """What every plan answers, whatever its own fields. Plans are dataclasses; these are
    properties, not fields, so that a plan's JSON form stays its own fields."""

    @property
    def changed(self) -> bool:
        """Whether the pass edited the graph."""
        raise NotImplementedError

    @property
    def skipped_reasons(self) -> dict[str, int]:
        """Why the pass left things alone -> how many."""
        return {}


class PassOptions(Protocol):
    """The options passes read (the driver's `RewriteOptions`)."""

    policy: str
    batch_size: int | None
    backward_scopes: list[str] | None
    swap: Any
    early_updates: bool

    def loop_body_policy(self) -> str | None: ...


@dataclass
class PassContext:
    """What a pass is given: the workspace being rewritten, the options, the checkpoint
    choice, the facts of the original graph and the plans of the passes before it.
    `index` and `regions` always describe the graph as the passes so far left it."""

    ws: Workspace
    options: PassOptions
    index: GraphIndex  # the caller's at first (the workspace's, or the original's in a
    # budget search, whose workspace holds a re-read copy), then each re-index's
    choice: CheckpointChoice
    checkpoints: list[str]  # tensor names the policy keeps
    original_regions: Regions  # of the graph before any pass (the recompute pass plans on it)
    facts: ForwardFacts
    plans: dict[str, PassPlan] = field(default_factory=dict)
    # the index the caller handed in: never edited in place (the caller keeps using it,
    # the budget search re-runs the passes from it)
    _given: GraphIndex | None = None
    _regions: Regions | None = None  # cached; None when stale

    def __post_init__(self) -> None:
        self._given = self.index
        self._regions = self.original_regions

    @property
    def regions(self) -> Regions:
        """The regions of the current graph, analysed when it changed since last asked."""
        if self._regions is None:
            o = self.options
            self._regions = analyze_regions(self.index, o.backward_scopes, o.batch_size,
                                            self.ws.collection("losses"))
        return self._regions

    @property
    def given_index(self) -> GraphIndex:
        """The index of the graph before any pass (the passes append nodes: its ids hold)."""
        assert self._given is not None
        return self._given

    def reindex(self) -> GraphIndex:
        """Index the graph as it is now; the regions are analysed again when next asked."""
        self.index = self.ws.reindex()
        self._regions = None
        return self.index

    def own_index(self) -> GraphIndex:
        """The index, fit to be edited in place: a new one when it is still the caller's
        (same ids: the graph is the same; the regions stay valid)."""
        if self.index is self._given:
            self.index = self.ws.reindex()
        return self.index

    def kept_tensors(self) -> list[Tensor]:
        """The checkpoints the policy kept that are still in the graph."""
        found = [self.index.tensor(name) for name in self.checkpoints]
        return [t for t in found if t is not None]


class Pass(ABC):
    """One rewrite pass. Subclasses set `name` and `edits` and implement `run`."""

    name: str
    edits: Edits

    def enabled(self, options: PassOptions) -> bool:
        """Whether the options ask for this pass."""
        return True

    def applies(self, context: PassContext) -> bool:
        """Whether the graph holds anything for it (no plan is reported when not)."""
        return True

    @abstractmethod
    def run(self, context: PassContext) -> PassPlan:
        """Edit `context.index.graph_def` (or, for control edges, graph and index) and
        return the plan."""
