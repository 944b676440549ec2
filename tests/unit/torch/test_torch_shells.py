"""The torch front ends are shells (issue 30): ``torch/loader.py`` and ``torch/live.py``
import nothing below ``load/`` except types (annotations and option classes); the run is
``load/``'s."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

from tests.helpers import ROOT

pytest.importorskip("torch")

PKG = pathlib.Path(ROOT) / "zephon_store"
BELOW_LOAD = ("_util", "format", "io", "order", "read", "write", "ingest")


def _below_load_imports(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from ..<below load> import name`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 2 and node.module \
                and node.module.split(".")[0] in BELOW_LOAD:
            out += [(node.module, alias.name) for alias in node.names]
    return out


@pytest.mark.parametrize("rel", ["torch/loader.py", "torch/live.py"])
def test_a_torch_shell_takes_only_types_from_below_load(rel):
    imported = _below_load_imports(PKG / rel)
    not_types = [f"{module}.{name}" for module, name in imported
                 if not isinstance(getattr(importlib.import_module(f"zephon_store.{module}"),
                                           name), type)]
    assert not not_types, f"{rel} imports more than types from below load/: {not_types}"


def test_the_check_sees_a_constant(tmp_path):
    (tmp_path / "x.py").write_text("from ..io.prefetch import DEFAULT_PREFETCH_BYTES\n")
    assert _below_load_imports(tmp_path / "x.py") == [("io.prefetch", "DEFAULT_PREFETCH_BYTES")]
    obj = importlib.import_module("zephon_store.io.prefetch").DEFAULT_PREFETCH_BYTES
    assert not isinstance(obj, type)
