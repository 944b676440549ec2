"""``zephon cache info`` in text: sizes in units parse_size reads back, values in one column
(issue 41 item 10); ``--json`` keeps raw bytes."""

from __future__ import annotations

import json

import pytest

from zephon_store._util.sizes import parse_size
from zephon_store.cli.common import format_size
from zephon_store.cli.main import main


@pytest.mark.parametrize("n,text", [(0, "0 B"), (3, "3 B"), (1023, "1023 B"), (1024, "1 KiB"),
                                    (1536, "1.5 KiB"), (10 << 30, "10 GiB"),
                                    (21474836480, "20 GiB"), (5 << 40, "5 TiB"),
                                    (123456789, "117.7 MiB")])
def test_format_size(n, text):
    assert format_size(n) == text
    assert abs(parse_size(text) - n) <= n / 1000


def test_cache_info_prints_sizes_in_units_and_aligned(tmp_path, monkeypatch, capsys):
    from zephon_store._util.hashing import xxh3_hex
    from zephon_store.io.cache import ChunkCache

    monkeypatch.setenv("ZEPHON_CACHE_BUDGET", "10GiB")
    ChunkCache(str(tmp_path / "c")).put(xxh3_hex(b"abc" * 1000), b"abc" * 1000)
    assert main(["cache", "info", "--dir", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = dict(line.split(None, 1) for line in lines)
    assert rows["budget"] == "10 GiB" and rows["bytes"] == "2.9 KiB"
    assert rows["entries"] == "1"
    starts = {len(line) - len(line.split(None, 1)[1]) for line in lines}
    assert len(starts) == 1, lines   # every value starts in one column

    assert main(["cache", "info", "--dir", str(tmp_path / "c"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["budget"] == 10 << 30 and info["bytes"] == 3000


def test_cache_clear_prints_sizes_in_units(tmp_path, capsys):
    from zephon_store._util.hashing import xxh3_hex
    from zephon_store.io.cache import ChunkCache

    ChunkCache(str(tmp_path / "c")).put(xxh3_hex(b"abc" * 1000), b"abc" * 1000)
    assert main(["cache", "clear", "--dir", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "cleared 2.9 KiB of cached row groups" in out, out
    assert " bytes" not in out, out
