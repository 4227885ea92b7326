"""The package's layout holds: no module imports another that imports it back (directly
or through others, TYPE_CHECKING imports included), and no module grows past 800 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 800


def _modules() -> dict[str, Path]:
    """Every module of the import root ``iqbridge``, by dotted name (adapters/ and
    recovery/ sit at the top level but import as iqbridge.adapters and
    iqbridge.recovery)."""
    mods: dict[str, Path] = {}
    for base, prefix in (
        (ROOT / "iqbridge", "iqbridge"),
        (ROOT / "adapters", "iqbridge.adapters"),
        (ROOT / "recovery", "iqbridge.recovery"),
    ):
        for path in base.rglob("*.py"):
            parts = path.relative_to(base).with_suffix("").parts
            name = ".".join((prefix, *parts))
            mods[name.removesuffix(".__init__")] = path
    return mods


def _imports(path: Path, mods: dict[str, Path]) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in mods:
                    found.add(sub)
                elif node.module in mods:
                    found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in mods)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    mods = _modules()
    graph = {name: _imports(path, mods) - {name} for name, path in mods.items()}
    assert "iqbridge.queue" in graph and "iqbridge.adapters.memory" in graph
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_over_800_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert len(sizes) > 40
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
