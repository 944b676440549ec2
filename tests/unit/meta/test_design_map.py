"""docs/design.md's module map lists every module of the package, and nothing else
(issue 30 item 8): a module added without a row, or a row left behind by a move, fails here.

The list comes from the tree at test time. A row's first cell names one or more modules by
their path under ``zephon_store/`` (```read/footers.py`, `read/mapped.py```); a package's
``__init__.py`` re-exports its folder and needs no row, except the top level's (the public
face).
"""

from __future__ import annotations

import os
import re

from tests.helpers import ROOT

PACKAGE = os.path.join(ROOT, "zephon_store")


def package_modules() -> set[str]:
    found = {"__init__.py"}
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__pycache__")))
        rel = os.path.relpath(folder, PACKAGE)
        for name in files:
            if name.endswith(".py") and name != "__init__.py":
                found.add(name if rel == "." else f"{rel}/{name}".replace(os.sep, "/"))
    return found


def mapped_modules() -> list[str]:
    """The paths named in the first cell of each row of the "Module map" table."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        text = f.read()
    section = text.split("\n## Module map\n", 1)[1].split("\n## ", 1)[0]
    named = []
    for line in section.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and not set(cells[1].strip()) <= set("-:"):
            named += re.findall(r"`([^`]+)`", cells[1])
    return named


def test_design_map_lists_every_module():
    missing = sorted(package_modules() - set(mapped_modules()))
    assert not missing, f"add a row to docs/design.md's module map for: {missing}"


def test_design_map_names_no_stale_module():
    stale = sorted(set(mapped_modules()) - package_modules())
    assert not stale, f"docs/design.md's module map names modules that are gone: {stale}"


def test_design_map_names_each_module_once():
    named = mapped_modules()
    assert len(named) == len(set(named)), sorted({n for n in named if named.count(n) > 1})


def test_design_page_names_only_files_that_exist():
    """The walk and the contracts name modules too: each `path.py` on the page exists, under
    ``zephon_store/`` or from the repository root (a glob matches something)."""
    import glob

    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        named = set(re.findall(r"`([\w./*-]+\.py)`", f.read()))
    gone = sorted(p for p in named
                  if not any(glob.glob(os.path.join(base, p)) for base in (PACKAGE, ROOT)))
    assert not gone, f"docs/design.md names files that are gone: {gone}"
