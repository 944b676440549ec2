"""verify checks every shard whatever else it found (issue 41 item 9): a damaged v4
row-group chunk is reported, and so is damage to a shard of the same dataset."""

from __future__ import annotations

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert, open_dataset
from zephon_store.cli.main import main
from zephon_store.read.verify import verify
from zephon_store.write import publish
from zephon_store.write.shardwriter import WriteOptions


@pytest.fixture()
def four(tmp_path, monkeypatch):
    """A format-v4 dataset of several shards whose row-group index is in chunks of 4."""
    write_jsonl_corpus(tmp_path / "src", files=2, records=150, seed=5)
    monkeypatch.setattr(publish, "ROW_GROUPS_PER_CHUNK", 4)
    convert([str(tmp_path / "src")], str(tmp_path / "ds"),
            options=WriteOptions(target_shard_bytes=16 << 10, row_group_rows=10))
    return tmp_path / "ds"


def _flip(path, at=None):
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_chunk_does_not_hide_a_damaged_shard(four, capsys):
    m = open_dataset(str(four)).manifest
    assert m.details.num_chunks > 2 and m.num_shards > 2
    _flip(four / f"index/{m.details.chunk_xxh3(1)}.arrow")
    # A row group of a chunk that is intact (the last), in a shard other than chunk 1's.
    rg = m.num_row_groups - 1
    shard = int(m.rg_shard[rg])
    assert shard not in {int(m.rg_shard[r]) for r in range(4, 8)}
    _flip(four / m.shard_path(shard), at=int(m.rg_offset[rg]) + 3)

    rep = verify(str(four), deep=True)
    assert rep.shards_checked == m.num_shards
    errors = [(f.kind, f.shard) for f in rep.findings if f.severity == "error"]
    assert ("row_group_chunk", None) in errors
    assert ("hash_mismatch", m.shard_name(shard)) in errors
    assert ("row_group_hash", m.shard_name(shard)) in errors
    # The damaged chunk's row groups are named as not checked, shard by shard.
    unchecked = [f for f in rep.findings if f.kind == "row_group_unchecked"]
    assert {f.shard for f in unchecked} == {m.shard_name(int(m.rg_shard[r]))
                                            for r in range(4, 8)}
    assert all("chunk 1" in f.message for f in unchecked)
    assert not rep.ok
    assert main(["verify", str(four), "--deep", "--json"]) == 1
    capsys.readouterr()


def test_a_damaged_chunk_alone_still_checks_every_shard(four):
    m = open_dataset(str(four)).manifest
    _flip(four / f"index/{m.details.chunk_xxh3(0)}.arrow")
    rep = verify(str(four), deep=True)
    assert rep.shards_checked == m.num_shards
    assert [f.kind for f in rep.findings if f.severity == "error"] == ["row_group_chunk"]
