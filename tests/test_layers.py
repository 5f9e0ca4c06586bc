"""Layers only point down: formats -> graph -> analysis -> passes -> drivers -> report/cli.

Read from the source (every import statement, those inside functions included, since a
lazy import is still a dependency), so a violation is caught before anything imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "graphmem"

# modules above the analyses: what graph/ and analysis/ must never import
ABOVE_ANALYSIS = ("graphmem.passes", "graphmem.rewrite", "graphmem.cli", "graphmem.report",
                  "graphmem.plan", "graphmem.estimate")
# drivers and presentation: what passes/ must never import
ABOVE_PASSES = ("graphmem.rewrite", "graphmem.cli", "graphmem.report", "graphmem.plan",
                "graphmem.estimate")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The package module `name` refers to (the longest known prefix)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    """module -> the graphmem modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[:len(package.split(".")) - node.level
                                                      + 1] + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            for name in names:
                target = _resolve(name, modules) if name.startswith("graphmem") else None
                if target and target != module:
                    graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _violations(graph, layer: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in graph.items()
                  if m == layer or m.startswith(layer + ".")
                  for t in targets if any(t == f or t.startswith(f + ".") for f in forbidden))


def test_the_import_graph_is_read():
    graph = import_graph()
    # a sanity check of the reader itself: known edges, module-level and lazy
    assert "graphmem.graph.index" in graph["graphmem.analysis.memory"]
    assert "graphmem.runtime.shape_inference" in graph["graphmem.graph.workspace"]
    assert "graphmem.graph.names" in graph["graphmem.graph.index"]


def test_the_package_has_no_import_cycle():
    assert _cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_graph_and_analysis_import_nothing_from_the_layers_above():
    graph = import_graph()
    assert _violations(graph, "graphmem.graph", ABOVE_ANALYSIS) == []
    assert _violations(graph, "graphmem.analysis", ABOVE_ANALYSIS) == []


def test_passes_import_no_driver_or_report():
    assert _violations(import_graph(), "graphmem.passes", ABOVE_PASSES) == []
