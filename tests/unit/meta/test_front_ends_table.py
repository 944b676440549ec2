"""The table "Every feature in every front end" in docs/loader.md cannot rot.

Every row of issue 30 item 3 and every front end is there; each cell is ✅ or ⛔ (a refusal)
naming at least one test;
every test a cell names exists (its file, a module-level ``def``, and a parametrize value
for ``name[value]``), and a cell of ``test_front_ends.py`` cites its own column's case.
"""

from __future__ import annotations

import ast
import os
import re

import pytest

from tests.helpers import ROOT

DOC = os.path.join(ROOT, "docs", "loader.md")
HEADING = "## Every feature in every front end"
COLUMNS = ["`ZephonLoader`", "`LiveZephonLoader` (torchft)", "TorchTitan (`ZephonDataLoader`)",
           "Grain (`ZephonIterDataset`)", "Grain (`ZephonSource`)"]
ROWS = ["a single dataset", "a mixture with stages", "a deny list",
        "the run log + `zephon audit` passing on the run", "byte prefetch into the disk cache",
        "the decoded cache", "process workers", "an elastic resume",
        "per-document attention data (`documents`)",
        "a document takedown (a deny list naming documents)"]
# The value each column's cases of tests/integration/test_front_ends.py are parametrized by.
FRONT_END_CASE = {COLUMNS[0]: "torch", COLUMNS[2]: "titan", COLUMNS[3]: "grain"}
TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(\w+)(?:\[([\w-]+)\])?`")


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the rows (lists of cells) of the table under ``HEADING``."""
    if HEADING not in text:
        raise AssertionError(f"docs/loader.md has no section {HEADING!r}")
    section = text.split(HEADING, 1)[1].split("\n## ", 1)[0]
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    return cells[0], cells[2:]


def cited(cell: str) -> list[tuple[str, str, str | None]]:
    """``(path, test name, parametrize value or None)`` of every test a cell names."""
    return [(p, n, v or None) for p, n, v in TEST_ID.findall(cell)]


def problems(text: str) -> list[str]:
    """What is wrong with the table (empty: nothing)."""
    header, rows = table(text)
    out = []
    if header[1:] != COLUMNS:
        out.append(f"columns {header[1:]} are not {COLUMNS}")
    if [r[0] for r in rows] != ROWS:
        out.append(f"rows {[r[0] for r in rows]} are not {ROWS}")
    for row in rows:
        for column, cell in zip(header[1:], row[1:]):
            where = f"{row[0]!r} x {column}"
            if not cell.startswith(("✅", "⛔")) or not cited(cell):
                out.append(f"{where}: {cell!r} is neither ✅ nor ⛔ with a test")
                continue
            for path, name, value in cited(cell):
                out += [f"{where}: {m}" for m in _missing(path, name, value)]
                if path.endswith("test_front_ends.py") and value != FRONT_END_CASE.get(column):
                    out.append(f"{where}: cites {name}[{value}], another column's case")
    return out


def _missing(path: str, name: str, value: str | None) -> list[str]:
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return [f"{path} does not exist"]
    with open(full, encoding="utf-8") as f:
        source = f.read()
    defs = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    if name not in defs:
        return [f"{path} has no test {name}"]
    if value is not None and f'"{value}"' not in source and f"'{value}'" not in source:
        return [f"{path}::{name} is not parametrized by {value!r}"]
    return []


def test_the_table_names_every_row_column_and_an_existing_test_per_cell() -> None:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    assert problems(text) == []


@pytest.mark.parametrize("edit, found", [
    (("test_a_deny_list[titan]", "test_a_denylist[titan]"), "has no test test_a_denylist"),
    (("tests/unit/runs/test_denylist.py", "tests/unit/runs/test_deny.py"), "test_deny.py does not exist"),
    (("test_process_workers[torch]", "test_process_workers[titan]"), "another column's case"),
    (("test_an_elastic_resume[torch]", "test_an_elastic_resume[jax]"), "parametrized by 'jax'"),
    (("| ✅ `tests/integration/test_front_ends.py::test_the_decoded_cache[titan]`",
      "| pending"), "neither"),
    (("| an elastic resume |", "| a resume |"), "rows"),
])
def test_a_rotten_table_is_caught(edit, found) -> None:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    old, new = edit
    assert old in text
    assert any(found in p for p in problems(text.replace(old, new, 1))), problems(
        text.replace(old, new, 1))
