"""No import circle inside normlab, and the kernel table names real kernels.

The graph is read from the source (every ``import`` and ``from ... import`` statement,
at module level or inside a function), so an import made lazily to break a circle at
run time still counts: the dispatch point reaches the kernels only through the strings
of ``normlab._backend.KERNELS``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import normlab
from normlab import _backend

ROOT = Path(normlab.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the normlab modules its import statements name."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module in mods:
                for a in node.names:  # a submodule, or a name of the module itself
                    sub = f"{node.module}.{a.name}"
                    graph[name].add(sub if sub in mods else node.module)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_the_old_circle() -> None:
    # the imports that made it: _backend -> kernels, kernels/quantize -> precision/rounding
    # (for RoundingMode), which dispatches through _backend
    graph = import_graph()
    graph["normlab._backend"] = graph["normlab._backend"] | {"normlab.kernels.quantize"}
    graph["normlab.kernels.quantize"] = graph["normlab.kernels.quantize"] | {
        "normlab.precision.formats.rounding"}
    assert any({"normlab._backend", "normlab.precision.formats.rounding"} <= set(c)
               for c in cycles(graph))


def test_no_import_circle() -> None:
    assert cycles(import_graph()) == []


def test_kernels_do_not_import_the_dispatch_point() -> None:
    graph = import_graph()
    assert [m for m in graph if m.startswith("normlab.kernels")
            and "normlab._backend" in graph[m]] == []


def test_the_kernel_table_names_functions() -> None:
    pytest.importorskip("numba")
    for name, target in _backend.KERNELS.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name
