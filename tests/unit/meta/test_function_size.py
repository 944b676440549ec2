"""No function or method in the package is longer than 80 lines (issue 30 item 7).

A function's length is ``end_lineno - lineno + 1`` of its ``def`` node: from the ``def`` line
to its last line, docstring, comments and blank lines inside it included, decorators above it
not. A nested function counts inside its parent and is also checked on its own.
"""

from __future__ import annotations

import ast
import pathlib

from tests.helpers import ROOT

PKG = pathlib.Path(ROOT) / "zephon_store"
LIMIT = 80

def _long_functions() -> dict[str, int]:
    """``{"load/pipeline.py::BatchPipeline._steps": 114, ...}`` for every function over LIMIT."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                length = child.end_lineno - child.lineno + 1
                if length > LIMIT:
                    found[f"{rel}::{name}"] = length
                visit(child, rel, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, rel, prefix + child.name + ".")
            else:
                visit(child, rel, prefix)

    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        visit(ast.parse(path.read_text(encoding="utf-8")), rel, "")
    return found


def test_no_function_over_80_lines():
    over = _long_functions()
    assert not over, (
        f"functions over {LIMIT} lines (split them into named helpers): "
        + ", ".join(f"{name} ({length})" for name, length in sorted(over.items()))
    )

