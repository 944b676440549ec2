"""The benchmarks are a package (issue 30 item 8): no suite edits ``sys.path``, ``run_all``
runs every suite, and the docs cite each as ``python -m benchmarks.<module>``."""

from __future__ import annotations

import ast
import os
import re

from benchmarks import run_all
from tests.helpers import ROOT

BENCH = os.path.join(ROOT, "benchmarks")
def _benchmark_files() -> list[str]:
    out = []
    for folder, dirs, files in os.walk(BENCH):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, BENCH)
        out += [n if rel == "." else f"{rel}/{n}".replace(os.sep, "/")
                for n in sorted(files) if n.endswith(".py")]
    return out


def edits_sys_path(path: str) -> bool:
    """Whether the file changes ``sys.path`` (insert, append, extend, assignment) or adds a
    site directory."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if node.func.attr == "addsitedir":
                return True
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value if isinstance(t, ast.Subscript) else t for t in targets
                           if isinstance(t, (ast.Attribute, ast.Subscript))), None)
        if (isinstance(target, ast.Attribute) and target.attr == "path"
                and isinstance(target.value, ast.Name) and target.value.id == "sys"):
            return True
    return False


def test_no_benchmark_edits_sys_path():
    editing = [f for f in _benchmark_files() if edits_sys_path(os.path.join(BENCH, f))]
    assert not editing, (f"{editing} edit sys.path: import the package "
                         "(`from . import corpora`), run children as `python -m "
                         "benchmarks.<module>` with benchmarks.harness.child_env")


def test_the_check_sees_an_edit(tmp_path):
    for code in ("import sys\nsys.path.insert(0, 'x')\n", "import sys\nsys.path[:0] = ['x']\n",
                 "import sys\nsys.path += ['x']\n", "import site\nsite.addsitedir('x')\n"):
        (tmp_path / "b.py").write_text(code)
        assert edits_sys_path(str(tmp_path / "b.py")), code
    (tmp_path / "b.py").write_text("import sys\nprint(sys.path[0])\n")
    assert not edits_sys_path(str(tmp_path / "b.py"))


def test_run_all_runs_every_suite():
    suites = {f[:-3] for f in os.listdir(BENCH)
              if f.endswith(".py") and (f.startswith("bench_") or f.startswith("ab_"))}
    for quick in (False, True):
        planned = {module for module, _ in run_all.suites(quick, "/before").values()}
        assert planned == suites, (quick, sorted(suites ^ planned))
        for module, _ in run_all.suites(quick, "/before").values():
            assert os.path.isfile(os.path.join(BENCH, module + ".py"))


def test_docs_cite_benchmarks_as_modules():
    """``python benchmarks/bench_x.py`` ran with the benchmarks folder first on the path; the
    package runs from the checkout's root as ``python -m benchmarks.bench_x``."""
    pages = [os.path.join("docs", n) for n in sorted(os.listdir(os.path.join(ROOT, "docs")))
             if n.endswith(".md")] + ["README.md", "Makefile"]
    modules = [n[:-3] for n in os.listdir(BENCH) if n.endswith(".py")]
    pattern = re.compile(r"python\S*\s+benchmarks/(" + "|".join(modules) + r")\.py\b")
    found = []
    for page in pages:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if pattern.search(line):
                    found.append(f"{page}:{n}: {line.strip()[:100]}")
    assert not found, "cite `python -m benchmarks.<module>`:\n" + "\n".join(found)
