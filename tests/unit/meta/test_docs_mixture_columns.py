"""docs/audit.md's example of a mixture whose sources have different columns works as written
(issue 41): its code blocks run in an empty folder, and each ``$ zephon ...`` line of its
console block prints what the page shows, through the CLI."""

from __future__ import annotations

import os
import re
import shlex

import pytest

from tests.helpers import ROOT, run_cli

HEADING = "### Example: sources with different columns"
DOC_DIR = "/tmp/mixcols"   # the folder the page's output was made in; its paths show it
_SECONDS = re.compile(r"\d+\.\d+ s\b")


def _blocks() -> list[tuple[str, str]]:
    with open(os.path.join(ROOT, "docs", "audit.md"), encoding="utf-8") as f:
        text = f.read()
    section = re.split(r"\n#{2,3} ", text.split(HEADING, 1)[1])[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def _console(block: str) -> list[tuple[list[str], list[str]]]:
    """``(argv after 'zephon', the lines shown)`` per ``$ zephon`` line of the block."""
    runs: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            argv = shlex.split(line[2:])
            assert argv[0] == "zephon", line
            runs.append((argv[1:], []))
        else:
            runs[-1][1].append(line)
    return runs


def test_the_mixture_with_different_columns_example_works_as_written(tmp_path, monkeypatch,
                                                                       capsys) -> None:
    pytest.importorskip("torch")
    blocks = _blocks()
    assert [lang for lang, _ in blocks] == ["python", "bash", "toml", "python", "console"]
    monkeypatch.chdir(tmp_path)
    (_, make), (_, convert), (_, toml), (_, train), (_, console) = blocks
    exec(compile(make, "docs/audit.md", "exec"), {})
    for line in convert.splitlines():
        argv = shlex.split(line)
        assert argv[0] == "zephon"
        code, _, err = run_cli(capsys, *argv[1:])
        assert code == 0, err
    name = toml.splitlines()[0].removeprefix("# ")
    (tmp_path / name).write_text(toml)
    exec(compile(train, "docs/audit.md", "exec"), {})
    runs = _console(console)
    assert len(runs) >= 5
    for argv, shown in runs:
        code, out, err = run_cli(capsys, *argv)
        got = (out + err).replace(str(tmp_path), DOC_DIR)
        # Only the seconds a command took differ from run to run.
        assert _SECONDS.sub("T s", got).splitlines() == [_SECONDS.sub("T s", s) for s in shown], (
            " ".join(argv))
        assert code == (2 if "error:" in got else 0), " ".join(argv)
