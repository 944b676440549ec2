"""``fill_decoded_cache``: the library function behind ``zephon cache fill`` (issue 30 item 4):
its report is what the CLI prints, and a second fill finds everything present."""

from __future__ import annotations

import json

from tests.helpers import write_jsonl_corpus
from zephon_store import FillReport, convert, fill_decoded_cache
from zephon_store.cli.main import main
from zephon_store.read.decoded_disk import ENV_BUDGET, ENV_DIR
from zephon_store.write.shardwriter import WriteOptions


def test_fill_report_is_what_the_cli_prints(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    monkeypatch.delenv(ENV_BUDGET, raising=False)
    write_jsonl_corpus(tmp_path / "src", files=1, records=40, seed=3)
    ds = str(tmp_path / "ds")
    convert([str(tmp_path / "src")], ds, options=WriteOptions(row_group_rows=10))
    decoded = str(tmp_path / "c" / "decoded")

    first = fill_decoded_cache(ds, decoded, budget_bytes=1 << 26, threads=2)
    assert isinstance(first, FillReport)
    assert (first.row_groups, first.filled, first.decoded, first.present) == (4, 4, 4, 0)
    assert first.complete and first.decoded_dir == decoded and first.bytes > 0
    assert first.job_env == {ENV_DIR: decoded, ENV_BUDGET: str(1 << 26)}
    assert not first.jobs_here_read_it and "is not set here" in first.warning

    assert main(["cache", "fill", ds, "--dir", str(tmp_path / "c"), "--budget", "64MiB",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    again = fill_decoded_cache(ds, decoded, budget_bytes=1 << 26)
    assert printed == json.loads(json.dumps(again.to_dict()))
    assert (again.decoded, again.present, again.complete) == (0, 4, True)
