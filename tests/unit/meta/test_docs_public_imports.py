"""Every code block of the docs imports public paths only (issue 30 item 6).

A reader copies a doc's example; if it imports ``zephon_store.runs.audit`` the first move of
a layer folder breaks their code. Public is ``zephon_store`` itself (its ``__all__``, loaded
lazily) and the documented public subpackages below (``docs/api.md``, "Python API"); every
other path under ``zephon_store.`` is internal. Prose may name internal modules for readers
who want the source: only fenced code blocks are checked.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

import zephon_store
from tests.helpers import ROOT

PACKAGE = os.path.join(ROOT, "zephon_store")

# The documented public subpackages (docs/api.md). The test infrastructure's modules are tools
# run with `python -m zephon_store.testing.<module>`, so each of them is public as a whole.
PUBLIC = ("zephon_store", "zephon_store.torch", "zephon_store.integrations.torchtitan",
          "zephon_store.integrations.torchtitan_override", "zephon_store.grain")
PUBLIC_TREES = ("zephon_store.testing",)

DOTTED = re.compile(r"\bzephon_store(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"\bfrom\s+(zephon_store(?:\.\w+)*)\s+import\s+\(?([\w\s,]+)\)?")


def _pages() -> list[str]:
    docs = sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                  if n.endswith(".md"))
    return docs + ["README.md", os.path.join("formats", "SPEC.md")]


def _code_lines(page: str) -> list[tuple[int, str]]:
    """(line number, line) of every line inside a fenced code block of ``page``."""
    out, fence = [], None
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            marker = re.match(r"\s*(```+|~~~+)", line)
            if marker and (fence is None or marker.group(1).startswith(fence)):
                fence = marker.group(1) if fence is None else None
                continue
            if fence is not None:
                out.append((n, line.rstrip("\n")))
    return out


def _module_of(dotted: str) -> str:
    """The longest prefix of ``dotted`` that is a module or package in the tree."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        rel = os.path.join(ROOT, *parts[:k])
        if os.path.isfile(rel + ".py") or os.path.isfile(os.path.join(rel, "__init__.py")):
            return ".".join(parts[:k])
    return parts[0]


def _is_public(module: str) -> bool:
    return module in PUBLIC or any(module == t or module.startswith(t + ".")
                                   for t in PUBLIC_TREES)


def _exported(module: str) -> set[str] | None:
    """The names ``module`` exports, read without importing it (torch stays unloaded); None
    for a module that is not in the tree yet (``zephon_store.grain``)."""
    if module == "zephon_store":
        return set(zephon_store.__all__) | set(zephon_store._LAZY)
    path = os.path.join(ROOT, *module.split("."))
    path = os.path.join(path, "__init__.py") if os.path.isdir(path) else path + ".py"
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                names |= set(ast.literal_eval(node.value))
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


def private_paths() -> list[str]:
    found = []
    for page in _pages():
        for n, line in _code_lines(page):
            for m in DOTTED.finditer(line):
                module = _module_of(m.group(0))
                if not _is_public(module):
                    found.append(f"{page}:{n}: {m.group(0)} (module {module} is internal)")
    return found


def test_doc_code_blocks_import_public_paths_only():
    found = private_paths()
    assert not found, ("code blocks import internal paths; import from zephon_store or a "
                       "public subpackage (docs/api.md):\n" + "\n".join(found))


def test_names_imported_by_doc_code_blocks_exist():
    missing = []
    for page in _pages():
        for n, line in _code_lines(page):
            for m in FROM_IMPORT.finditer(line):
                module = m.group(1)
                exported = _exported(module) if _is_public(module) else None
                if exported is None:
                    continue
                for name in re.split(r"[\s,]+", m.group(2).strip()):
                    if name and name != "as" and name not in exported:
                        missing.append(f"{page}:{n}: {module} has no {name}")
    assert not missing, "\n".join(missing)


def test_every_lazy_name_resolves():
    """A module that moves takes its entry in ``zephon_store._LAZY`` along, or this fails."""
    pytest.importorskip("torch")
    for name in list(zephon_store.__all__) + sorted(zephon_store._LAZY):
        assert getattr(zephon_store, name) is not None, name


def test_star_import_stays_free_of_torch():
    """``from zephon_store import *`` loads every name of ``__all__``: none may need torch."""
    code = ("import sys\nfrom zephon_store import *\n"
            "assert not any(m.split('.')[0] in ('torch', 's3fs') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 's3fs'))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
