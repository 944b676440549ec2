"""A small local text dataset for the account's and the forecast's tests."""

from __future__ import annotations

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    """A dataset of 400 JSONL records in row groups of about 6 KiB, shards of 40 KiB."""
    d = tmp_path_factory.mktemp("observe")
    write_jsonl_corpus(d / "src", files=2, records=200, seed=4)
    convert([str(d / "src")], str(d / "ds"),
            options=WriteOptions(target_shard_bytes=40 << 10, row_group_bytes=6 << 10))
    return str(d / "ds")
