"""Tests import their helpers as packages, never a file from tools/, benchmarks/ or scripts/
by path (issue 15): the S3 launcher, the torchrun worker and the golden inputs live in
``zephon_store.testing``; the demo scripts are run, not imported."""

from __future__ import annotations

import ast
import pathlib

from tests.helpers import ROOT

TESTS = pathlib.Path(ROOT) / "tests"
LOADERS = {"spec_from_file_location", "SourceFileLoader", "run_path", "load_source"}
FOLDERS = {"tools", "benchmarks", "scripts"}


def _path_parts(value: str) -> set[str]:
    return set(value.replace("\\", "/").split("/"))


def offences(source: str, name: str) -> list[str]:
    """Where ``source`` loads a module by file path, builds a path into tools/ or
    benchmarks/, or puts tools/, benchmarks/ or scripts/ on ``sys.path`` or into an import."""
    out = []
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in LOADERS:
            out.append(f"{name}:{node.lineno}: {node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("insert", "append") and "path" in ast.unparse(node.func):
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and _path_parts(c.value) & FOLDERS for c in ast.walk(node)):
                out.append(f"{name}:{node.lineno}: sys.path gets {ast.unparse(node)}")
        if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("path.join")) \
                or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
            if any(isinstance(c, ast.Constant) and isinstance(c.value, str)
                   and _path_parts(c.value) & {"tools", "benchmarks"}
                   for c in ast.iter_child_nodes(node) if not isinstance(node, ast.Call)
                   or c in node.args):
                out.append(f"{name}:{node.lineno}: a path into tools/ or benchmarks/")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            if any(m.split(".")[0] in FOLDERS | {"s3_server", "elastic_worker", "make_golden"}
                   for m in mods):
                out.append(f"{name}:{node.lineno}: import {mods}")
    return sorted(out, key=lambda o: int(o.split(":")[1]))


# Tests whose subject is the benchmarks' own layout (issue 30 item 8): they import
# benchmarks.run_all and walk benchmarks/ to check it, which is what they test.
LAYOUT_CHECKS = {"unit/meta/test_benchmarks_layout.py"}


def test_no_test_loads_a_file_by_path() -> None:
    found = [o for p in sorted(TESTS.rglob("*.py"))
             if str(p.relative_to(TESTS)) not in LAYOUT_CHECKS
             for o in offences(p.read_text(encoding="utf-8"), str(p.relative_to(TESTS)))]
    assert found == []


def test_the_check_catches_each_way_of_loading_by_path() -> None:
    bad = '''
import importlib.util, sys, os, runpy
spec = importlib.util.spec_from_file_location("m", "tools/make_golden.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
runpy.run_path("benchmarks/corpora.py")
import elastic_worker
WORKER = pathlib.Path(ROOT) / "tools" / "elastic_worker.py"
'''
    found = offences(bad, "bad.py")
    assert [f.split(": ")[1].split(" ")[0] for f in found] == [
        "spec_from_file_location", "sys.path", "a", "run_path", "import", "a"], found
