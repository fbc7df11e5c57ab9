"""The package's dependency rules: no import cycles, optional dependencies imported where used."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfmodel"
OPTIONAL = ("torch", "matplotlib", "huggingface_hub")  # extras: imported inside the functions that need them


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan 1972)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_inside_perfmodel():
    grimp = pytest.importorskip("grimp")  # installed with import-linter (the test extra)
    graph = grimp.build_graph("perfmodel")  # module-level and function-level imports alike
    assert _cycles(graph) == []


def _module_level_imports(tree: ast.Module):
    for node in tree.body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_optional_dependencies_are_not_imported_at_module_level():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _module_level_imports(ast.parse(path.read_text())):
            if name.split(".")[0] in OPTIONAL:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {name}")
    assert offenders == []
