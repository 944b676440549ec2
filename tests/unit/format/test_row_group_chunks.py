"""Format v4's chunked row-group index (formats/SPEC.md 4.1): chunks fetched on first use,
once, verified and checked; the same rows as one chunk; gc and verify see every chunk."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import threading

import numpy as np
import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import IntegrityError, ManifestError, convert, open_dataset
from zephon_store._util.hashing import xxh3_hex
from zephon_store.format.chunks import ChunkedDetails
from zephon_store.format.manifest import compute_dataset_id, load_manifest
from zephon_store.io.storage import Storage
from zephon_store.read.verify import verify
from zephon_store.write import publish
from zephon_store.write.shardwriter import WriteOptions

OPTS = WriteOptions(target_shard_bytes=16 << 10, row_group_rows=10)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """The same corpus converted with the default chunk (one) and with chunks of 4."""
    d = tmp_path_factory.mktemp("chunks")
    write_jsonl_corpus(d / "src", files=2, records=150, seed=5)
    convert([str(d / "src")], str(d / "one"), options=OPTS)
    mp = pytest.MonkeyPatch()
    mp.setattr(publish, "ROW_GROUPS_PER_CHUNK", 4)
    try:
        convert([str(d / "src")], str(d / "four"), options=OPTS)
    finally:
        mp.undo()
    return d / "one", d / "four"


@pytest.fixture()
def four(pair, tmp_path):
    out = tmp_path / "four"
    shutil.copytree(pair[1], out)
    return out


def test_small_chunks_read_the_same_rows_and_fetch_only_what_is_read(pair):
    one, four = (open_dataset(str(p)) for p in pair)
    m = four.manifest
    assert m.details.per_chunk == 4 and m.details.num_chunks == -(-m.num_row_groups // 4) > 3
    assert one.manifest.details.num_chunks == 1
    # Same shards, so same samples; only the index is laid out differently.
    assert one.take(np.arange(one.num_samples)).equals(four.take(np.arange(four.num_samples)))
    fresh = open_dataset(str(pair[1]))
    assert fresh.manifest.details.loaded() == []
    fresh.take([0, fresh.num_samples - 1])
    assert fresh.manifest.details.loaded() == [0, m.details.num_chunks - 1]
    assert verify(str(pair[1]), deep=True).ok


def test_threads_asking_for_one_chunk_fetch_it_once(pair):
    st = Storage(str(pair[1]))
    m = load_manifest(st)
    reads = []
    real = m.details._read

    def counted(h):
        reads.append(h)
        return real(h)
    m.details._read = counted
    barrier = threading.Barrier(8)

    def ask():
        barrier.wait()
        return int(m.rg_offset[5])
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reads == [m.details.chunk_xxh3(1)]
    m.rg_length[np.arange(m.num_row_groups)]   # every other chunk, once each
    assert sorted(reads) == sorted(m.details.chunk_xxh3(c) for c in range(m.details.num_chunks))


def test_chunks_are_referenced_so_gc_keeps_them(pair):
    m = open_dataset(str(pair[1])).manifest
    chunks = set(m.details.paths())
    assert len(chunks) == m.details.num_chunks and chunks <= m.referenced_paths()
    assert m.unreferenced(Storage(str(pair[1])).listdir) == []
    assert set(m.table_sizes()) >= chunks


def test_a_pickled_manifest_keeps_its_chunks_and_reads_more(pair):
    m = open_dataset(str(pair[1])).manifest
    first = int(m.rg_offset[0])
    m2 = pickle.loads(pickle.dumps(m))
    assert m2.details.loaded() == [0]
    assert int(m2.rg_offset[0]) == first and m2.rg_xxh3(9) == m.rg_xxh3(9)


def test_a_damaged_chunk_is_refused_when_read(four):
    m = open_dataset(str(four)).manifest
    path = four / f"index/{m.details.chunk_xxh3(1)}.arrow"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    d = open_dataset(str(four))
    d.take([0])                                   # chunk 0 is fine
    with pytest.raises(IntegrityError):
        d.take([int(d.manifest.rg_row_start[5])])   # row group 5: chunk 1
    assert any(f.kind == "row_group_chunk" for f in verify(str(four)).findings)


def test_a_missing_chunk_is_named(four):
    m = open_dataset(str(four)).manifest
    rel = f"index/{m.details.chunk_xxh3(2)}.arrow"
    os.unlink(four / rel)
    d = open_dataset(str(four))
    with pytest.raises(ManifestError, match=rel):
        d.take([int(d.manifest.rg_row_start[8])])
    rep = verify(str(four))
    assert [f.kind for f in rep.findings if f.severity == "error"] == ["row_group_chunk"]


def _reseal(root, edit):
    doc = json.loads((root / "manifest.json").read_text())
    edit(doc)
    doc["dataset_id"] = compute_dataset_id(doc)
    (root / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("value", [0, 3, 5, "4", None])
def test_a_forged_chunk_size_is_refused_at_open(four, value):
    _reseal(four, lambda d: d.__setitem__("row_groups_per_chunk", value))
    with pytest.raises(ManifestError):
        open_dataset(str(four))
    assert not verify(str(four)).ok


def test_row_groups_per_chunk_only_in_v4(four):
    _reseal(four, lambda d: d.pop("row_groups_per_chunk"))
    with pytest.raises(ManifestError, match="lacks 'row_groups_per_chunk'"):
        open_dataset(str(four))


def test_a_chunk_whose_ranges_overlap_the_previous_chunk_fails_verify(four):
    """Within a chunk a reader checks every range; across a border only verify can (it
    fetches every chunk). The overlap is forged into a resealed chunk and index."""
    from zephon_store.format.chunks import chunk_tables, index_table
    from zephon_store.format.manifest import SIDE_TABLE_COMPRESSION, table_to_ipc

    m = open_dataset(str(four)).manifest
    m.details.load_all()
    same_shard = [c for c in range(1, m.details.num_chunks)
                  if m.rg_shard[4 * c] == m.rg_shard[4 * c - 1]]
    assert same_shard, "a shard that spans a chunk border"
    c = same_shard[0]
    offset, length = np.asarray(m.rg_offset), np.asarray(m.rg_length)
    offset[4 * c] -= 1                                  # starts inside the previous one
    length[4 * c] += 1
    digests = np.concatenate([m.details.chunk(i)[2] for i in range(m.details.num_chunks)])
    refs = []
    for t in chunk_tables(offset, length, digests, 4):
        data = table_to_ipc(t, compression=SIDE_TABLE_COMPRESSION)
        h = xxh3_hex(data)
        (four / f"index/{h}.arrow").write_bytes(data)
        refs.append((bytes.fromhex(h), len(data)))
    data = table_to_ipc(index_table(m.rg_rows, length, refs, 4),
                        compression=SIDE_TABLE_COMPRESSION)
    h = xxh3_hex(data)
    (four / f"index/{h}.arrow").write_bytes(data)
    _reseal(four, lambda d: d["tables"]["row_groups"].update(
        path=f"index/{h}.arrow", xxh3=h, bytes=len(data)))
    d = open_dataset(str(four))
    assert int(d.manifest.rg_offset[4 * c]) == offset[4 * c]   # the chunk alone passes
    assert any("overlaps" in f.message for f in verify(str(four)).findings)


def test_details_of_a_manifest_without_chunks_say_so(pair):
    m = open_dataset(str(pair[1])).manifest
    bare = ChunkedDetails(m.tables["row_groups"], per_chunk=4, num_row_groups=m.num_row_groups,
                          url="<memory>", read=None, check=lambda *a: None)
    with pytest.raises(ManifestError, match="not available"):
        bare.offset[0]
