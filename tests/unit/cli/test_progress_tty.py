"""Long commands show progress on a terminal and stay quiet otherwise (issue 43 item 6):
``verify --deep``, ``cache fill``, ``gc`` and ``convert``, each run with its stderr on a
pseudo-terminal and on a pipe (``--engine ray``: tests/integration/test_convert_ray.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import converted
from tests.helpers.tty import run_on_tty


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> str:
    return converted(tmp_path_factory.mktemp("progress"), files=2, records=600,
                     target_shard_bytes=20_000, row_group_rows=50)


def _env(tmp: str) -> dict:
    # The decoded cache filled is the one jobs read: fill prints no advice to stderr.
    return dict(os.environ, ZEPHON_DECODED_CACHE_DIR=os.path.join(tmp, "fill", "decoded"))


def _orphan(ds: str) -> None:
    with open(os.path.join(ds, "shards", "ab" * 16 + ".parquet"), "wb") as f:
        f.write(b"x" * 100)


# (arguments, what the bar says, a line of the result on stdout)
COMMANDS = {
    "verify": (["verify", "--deep", "{ds}"], "verify:", "OK: "),
    "fill": (["cache", "fill", "{ds}", "--dir", "{tmp}/fill"], "fill:", " row groups of "),
    "gc": (["gc", "{ds}"], "gc:", "removed 1 file(s)"),
    "convert": (["convert", "{src}", "-o", "{tmp}/out"], "write:", "wrote 1200 samples"),
}


def _argv(name: str, ds: str, tmp: str) -> list[str]:
    src = os.path.join(os.path.dirname(ds), "src")
    return [sys.executable, "-m", "zephon_store.cli",
            *(a.format(ds=ds, tmp=tmp, src=src) for a in COMMANDS[name][0])]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_terminal_shows_the_bar(ds, tmp_path, name) -> None:
    _orphan(ds)
    rc, out, shown = run_on_tty(_argv(name, ds, str(tmp_path)), env=_env(str(tmp_path)))
    assert rc == 0, shown[-2000:]
    assert COMMANDS[name][1] in shown, shown[-2000:]
    assert COMMANDS[name][2] in out and COMMANDS[name][1] not in out, out


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_pipe_gets_no_bar(ds, tmp_path, name) -> None:
    _orphan(ds)
    r = subprocess.run(_argv(name, ds, str(tmp_path)), capture_output=True, text=True,
                       env=_env(str(tmp_path)), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr == "" and COMMANDS[name][2] in r.stdout, (r.stderr[-2000:], r.stdout)


@pytest.mark.parametrize("name", ["verify", "gc"])
def test_json_on_a_terminal_gets_no_bar(ds, tmp_path, name) -> None:
    _orphan(ds)
    rc, out, shown = run_on_tty(_argv(name, ds, str(tmp_path)) + ["--json"],
                                env=_env(str(tmp_path)))
    assert rc == 0 and out.lstrip().startswith("{"), (out, shown[-2000:])
    assert COMMANDS[name][1] not in shown, shown[-2000:]

