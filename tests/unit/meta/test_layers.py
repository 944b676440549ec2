"""The package's layers import one way only, and no private name crosses a folder.

Layers, bottom to top (docs/design.md):

    errors, _util  <  observe  <  format, order  <  io  <  ingest, read  <  mix  <  write, load
                   <  runs, torch, grain  <  cli, integrations, testing

A module may import from its own folder and from any lower layer; never from a higher or a
sibling one (``write`` does not import ``load``; ``read`` does not import ``ingest``). A name
starting with ``_`` is private to its folder.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from tests.helpers import ROOT

PKG = pathlib.Path(ROOT) / "zephon_store"

RANK = {
    "errors": 0, "_util": 0,
    "observe": 0.5,
    "format": 1, "order": 1,
    "io": 2,
    "ingest": 3, "read": 3,
    "mix": 4,
    "write": 5, "load": 5,
    "runs": 6, "torch": 6, "grain": 6,
    "cli": 7, "integrations": 7, "testing": 7,
}
# Same rank, still allowed: the write path converts what ingest reads.
ALSO = {("write", "ingest")}


def _layer(module: str) -> str:
    """``zephon_store.io.storage`` -> ``io``; the package root itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: pathlib.Path):
    """(line, absolute module, imported names) of every zephon_store import in ``path``."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    here = list(rel.parts)[:-1]   # the package a relative import starts from
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "zephon_store":
                continue
            names = [a.name for a in node.names]
            if mod == "zephon_store":  # `from .. import x` names a submodule or a root attribute
                for name in names:
                    yield node.lineno, f"zephon_store.{name}", []
            else:
                yield node.lineno, mod, names
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "zephon_store":
                    yield node.lineno, a.name, []


def _modules():
    return sorted(p for p in PKG.rglob("*.py"))


def test_the_layer_table_names_every_folder():
    folders = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    assert folders | modules == set(RANK), "add the new folder to RANK and docs/design.md"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down_and_names_stay_private(path):
    parts = [p for p in path.relative_to(PKG).with_suffix("").parts if p != "__init__"]
    src = _layer(".".join(["zephon_store", *parts]))
    problems = []
    for line, mod, names in _imports(path):
        dst = _layer(mod)
        if src == "" or dst in ("", "__version__"):
            continue  # the package root re-exports lazily; __version__ is a root constant
        if dst != src:
            if RANK[dst] >= RANK[src] and (src, dst) not in ALSO:
                problems.append(f"line {line}: {src} imports {mod} (layer {dst} is not below)")
            private = [n for n in names if n.startswith("_")]
            if private:
                problems.append(f"line {line}: private {private} imported from {mod}")
    assert not problems, f"{path.relative_to(PKG)}:\n" + "\n".join(problems)
