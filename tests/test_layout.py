"""Small pieces: no function over 60 lines and no module over 500 lines in perfmodel/ (DESIGN.md)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "perfmodel"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 500


def offenders() -> dict[str, int]:
    """Modules over MAX_MODULE_LINES and functions over MAX_FUNCTION_LINES ("module:function"), by length."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(PACKAGE.parent).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found[rel] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found[f"{rel}:{node.name}"] = max(length, found.get(f"{rel}:{node.name}", 0))
    return found


def test_modules_and_functions_are_small():
    found = offenders()
    assert not found, (f"over {MAX_MODULE_LINES} lines per module or {MAX_FUNCTION_LINES} per function "
                       f"(split them): {found}")


if __name__ == "__main__":  # python tests/test_layout.py lists every offender
    for name, lines in offenders().items():
        print(f"{name}: {lines}")
