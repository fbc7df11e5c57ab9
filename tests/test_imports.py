"""The package's dependency rules: no import cycles, optional dependencies imported where used."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "perfmodel"
OPTIONAL = ("torch", "matplotlib", "huggingface_hub")  # extras: imported inside the functions that need them
# perfmodel modules imported inside a function, (file, function, module imported) -> why: none. The
# CLI imports its back ends at module level; scipy, which they use, loads on first use
# (perfmodel/core/lazy.py), so `perfmodel --help` stays light. The package root's lazy names use
# importlib in __getattr__ and are no import statement.
FUNCTION_LEVEL_ALLOWED: dict = {}


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


def _function_level_perfmodel_imports(tree: ast.Module):
    """(function, module) of every import of a perfmodel module (absolute or relative) inside a function."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, child.name)
                continue
            if function is not None and isinstance(child, ast.ImportFrom):
                if child.level or (child.module or "").split(".")[0] == "perfmodel":
                    yield function, "." * child.level + (child.module or "")
            elif function is not None and isinstance(child, ast.Import):
                yield from ((function, a.name) for a in child.names if a.name.split(".")[0] == "perfmodel")
            yield from walk(child, function)
    yield from walk(tree, None)


def test_perfmodel_modules_are_imported_at_module_level():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        found |= {(rel, fn, mod) for fn, mod in _function_level_perfmodel_imports(ast.parse(path.read_text()))}
    unexpected = sorted(found - set(FUNCTION_LEVEL_ALLOWED))
    assert not unexpected, ("import these at module level (a cycle means a shared piece belongs in a lower "
                            f"layer): {unexpected}")
    assert found == set(FUNCTION_LEVEL_ALLOWED), f"allowed but gone (remove): {set(FUNCTION_LEVEL_ALLOWED) - found}"


def test_function_level_check_sees_nested_and_relative_imports():
    tree = ast.parse("import perfmodel\n"
                     "def f():\n    if x:\n        from perfmodel.predict import predict\n"
                     "class C:\n    def m(self):\n        from . import units\n        import numpy\n")
    assert sorted(_function_level_perfmodel_imports(tree)) == [("f", "perfmodel.predict"), ("m", ".")]
