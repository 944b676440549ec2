"""The convert progress bars print counts as a person reads them (issue 41 item 10): whole
shards (not ``1.00/9.00``) and whole samples (not ``samples=3e+4``)."""

from __future__ import annotations

import json
import re

import zephon_store as z


def test_the_bars_print_whole_numbers(tmp_path, capsys) -> None:
    for k in range(2):
        with open(tmp_path / f"part{k}.jsonl", "w") as f:
            for i in range(15000):
                f.write(json.dumps({"id": i}) + "\n")
    z.convert([str(tmp_path / "part0.jsonl"), str(tmp_path / "part1.jsonl")],
              str(tmp_path / "out"), progress=True,
              options=z.WriteOptions(target_shard_bytes=1 << 16, row_group_rows=1000,
                                     row_group_bytes=None))
    err = capsys.readouterr().err
    assert "samples=30,000" in err and "e+" not in err, err[-2000:]
    shards = re.findall(r"write:.*?(\S+)/(\S+) \[", err)
    assert shards and all(a.isdigit() and b.isdigit() for a, b in shards), shards[-3:]
