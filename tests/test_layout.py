"""Small pieces: no function over 60 lines and no module over 500 lines in perfmodel/ (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perfmodel"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def offenders():
    """(long modules, long functions) of the package, as 'path: lines' strings."""
    modules, functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PACKAGE.parent)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            modules.append(f"{rel}: {lines}")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    functions.append(f"{rel}:{node.lineno} {node.name}: {length}")
    return modules, functions


def test_modules_and_functions_are_small():
    modules, functions = offenders()
    assert not modules, f"modules over {MAX_MODULE_LINES} lines: {modules}"
    assert not functions, f"functions over {MAX_FUNCTION_LINES} lines: {functions}"


if __name__ == "__main__":  # python tests/test_layout.py lists the offenders
    for line in (*offenders()[0], *offenders()[1]):
        print(line)
