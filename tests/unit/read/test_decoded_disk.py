"""The node-local decoded cache: what it hands out equals a fresh decode, a damaged entry is
never served, keys follow the shard's content, the budget holds and a failing disk only
costs speed."""

from __future__ import annotations

import os
import pickle
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_store import (
    BatchOptions,
    DecodedDiskCache,
    SourceOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    as_numpy,
    convert,
    open_dataset,
)
from zephon_store._util.hashing import xxh3_hex
from zephon_store.order import OrderOptions
from zephon_store.read.decoded_disk import _TRAILER, ENV_DIR, as_decoded_cache, decoded_key
from zephon_store.write.shardwriter import WriteOptions


def _write(path, n: int, *, salt: int = 0) -> None:
    windows = np.arange(n * 6, dtype=np.int32).reshape(n, 6) + salt
    pq.write_table(pa.table({
        "tokens": pa.FixedSizeListArray.from_arrays(pa.array(windows.reshape(-1)), 6),
        "x": pa.array([None if 40 <= i < 45 else i * 10 + salt for i in range(n)], pa.int64()),
        "s": [None if i % 17 == 0 else f"doc {i + salt} ü" for i in range(n)],
        "L": pa.array([f"large {i}" * (i % 4) for i in range(n)], pa.large_string()),
        "b": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary()),
        "tags": [[f"t{j}" for j in range(i % 3)] for i in range(n)],
    }), path)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    d = tmp_path_factory.mktemp("decoded")
    _write(d / "in.parquet", 230)
    convert([str(d / "in.parquet")], str(d / "ds"), options=WriteOptions(row_group_rows=19))
    return str(d / "ds")


def _all_row_groups(ds) -> list[pa.Table]:
    return [ds.row_groups.read(rg, keep=False) for rg in range(ds.manifest.num_row_groups)]


def _entries(cache: DecodedDiskCache) -> list[str]:
    root = os.path.join(cache.directory, "v1", "objects")
    return sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs
                  if not f.startswith("."))


def test_tables_from_the_cache_equal_fresh_decodes(mixed, tmp_path):
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc", budget_bytes="64MiB")
    first = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    assert cache.stats.misses == cache.store_stats.puts == len(want) and cache.stats.hits == 0
    again = DecodedDiskCache(tmp_path / "dc")          # another process's handle
    second = _all_row_groups(open_dataset(mixed, decoded_cache=again))
    assert again.stats.hits == len(want) and again.stats.misses == 0
    for w, a, b in zip(want, first, second):
        assert a.equals(w) and b.equals(w)
        assert b.schema == w.schema


def test_the_loader_gives_the_same_batches_cold_warm_and_in_worker_processes(mixed, tmp_path):
    def batches(**kw):
        from zephon_store.torch import ZephonLoader

        loader = ZephonLoader(mixed, topology=Topology(8, world_size=1, rank=0),
                              batch=BatchOptions(with_seq=True, collate=as_numpy),
                              order=OrderOptions(seed=4, shuffle=True),
                              stop=StopOptions(epochs=2.0), **kw)
        return [{k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
                for b in loader]

    pytest.importorskip("torch")
    want = batches(source=SourceOptions(decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc")
    cached = SourceOptions(decoded_cache=cache)
    assert batches(source=cached) == want           # cold: decodes and writes
    assert cache.store_stats.puts == open_dataset(mixed).manifest.num_row_groups
    assert batches(source=cached) == want           # warm: maps
    assert cache.stats.hits > 0
    assert batches(source=cached,
                   workers=WorkerOptions(num_workers=2)) == want   # pickled into workers


def test_a_damaged_entry_is_dropped_counted_and_decoded_again(mixed, tmp_path):
    cache = DecodedDiskCache(tmp_path / "dc")
    want = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    paths = _entries(cache)
    # One flipped byte in the middle, one truncated file, one trailer with a foreign magic.
    with open(paths[0], "r+b") as f:
        f.seek(os.path.getsize(paths[0]) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    with open(paths[1], "r+b") as f:
        f.truncate(os.path.getsize(paths[1]) - 7)
    with open(paths[2], "r+b") as f:
        f.seek(-_TRAILER.size, os.SEEK_END)
        f.write(b"NOTOURS!")
    fresh = DecodedDiskCache(tmp_path / "dc")
    got = _all_row_groups(open_dataset(mixed, decoded_cache=fresh))
    assert all(g.equals(w) for g, w in zip(got, want))
    assert fresh.stats.corrupt == 3 and fresh.store_stats.puts == 3
    assert fresh.store_stats.corrupt == 3
    # The damaged files were replaced by good ones: the next reader hits everything.
    last = DecodedDiskCache(tmp_path / "dc")
    _all_row_groups(open_dataset(mixed, decoded_cache=last))
    assert last.stats.corrupt == 0 and last.stats.hits == len(want)


def test_an_entry_with_another_schema_is_not_served(tmp_path):
    cache = DecodedDiskCache(tmp_path / "dc")
    key = "cd" * 16
    assert cache.put(key, pa.table({"a": [1, 2]}))
    assert cache.get(key, pa.schema([("a", pa.string())])) is None
    assert cache.stats.corrupt == 1 and cache.get(key, pa.schema([("a", pa.int64())])) is None


def test_keys_follow_the_shard_content_not_the_url(mixed, tmp_path):
    """A copy of the dataset at another path hits the first one's entries; a dataset with
    other contents (same layout, same row counts) never does."""
    copy = str(tmp_path / "copy")
    shutil.copytree(mixed, copy)
    cache = DecodedDiskCache(tmp_path / "dc")
    _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    other_cache = DecodedDiskCache(tmp_path / "dc")
    _all_row_groups(open_dataset(copy, decoded_cache=other_cache))
    assert other_cache.stats.misses == 0

    _write(tmp_path / "in2.parquet", 230, salt=1)
    convert([str(tmp_path / "in2.parquet")], str(tmp_path / "ds2"),
            options=WriteOptions(row_group_rows=19))
    third = DecodedDiskCache(tmp_path / "dc")
    want = _all_row_groups(open_dataset(str(tmp_path / "ds2"), decoded_cache=False))
    got = _all_row_groups(open_dataset(str(tmp_path / "ds2"), decoded_cache=third))
    assert third.stats.hits == 0 and all(g.equals(w) for g, w in zip(got, want))
    assert decoded_key("ab" * 16, 0, b"x") != decoded_key("ab" * 16, 0, b"y")


def test_the_budget_holds_and_mapped_tables_outlive_eviction(mixed, tmp_path):
    ds = open_dataset(mixed, decoded_cache=False)
    one = len(pickle.dumps(ds.row_groups.read(0)))     # ~ one entry's size
    cache = DecodedDiskCache(tmp_path / "dc", budget_bytes=4 * one)
    dsc = open_dataset(mixed, decoded_cache=cache)
    held = [dsc.row_groups.read(rg, keep=False) for rg in range(ds.manifest.num_row_groups)]
    assert cache.info()["bytes"] <= 4 * one
    assert cache.store_stats.evictions > 0
    # Evicted entries were unlinked while their tables were still mapped: still readable.
    for rg, t in enumerate(held):
        assert t.equals(ds.row_groups.read(rg, keep=False))
    tiny = DecodedDiskCache(tmp_path / "tiny", budget_bytes=100)
    assert not tiny.put("ef" * 16, ds.row_groups.read(0))
    assert tiny.info()["entries"] == 0


def test_a_disk_that_fails_costs_speed_not_data(mixed, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = DecodedDiskCache(blocker / "dc")            # every write fails: ENOTDIR
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    got = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    assert all(g.equals(w) for g, w in zip(got, want))
    assert cache.stats.hits == 0 and cache.store_stats.bypassed > 0
    warned = [r.getMessage() for r in caplog.records if "is not usable" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(f"decoded cache {blocker / 'dc'} ")
    assert "ZEPHON_DECODED_CACHE_DIR" in warned[0] and "decoded_cache=False" in warned[0]


def test_the_argument_and_the_environment(mixed, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_DIR, raising=False)
    assert open_dataset(mixed).decoded_cache is None
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "env"))
    ds = open_dataset(mixed)
    assert ds.decoded_cache.directory == str(tmp_path / "env")
    assert open_dataset(mixed, decoded_cache=False).decoded_cache is None
    assert pickle.loads(pickle.dumps(ds)).decoded_cache.directory == str(tmp_path / "env")
    assert as_decoded_cache(str(tmp_path / "p")).directory == str(tmp_path / "p")
    with pytest.raises(TypeError, match="decoded_cache must be"):
        open_dataset(mixed, decoded_cache=3)


def _read_all_at_once(mixed: str, directory: str, barrier, out) -> None:
    cache = DecodedDiskCache(directory)
    ds = open_dataset(mixed, decoded_cache=cache)
    barrier.wait()
    _all_row_groups(ds)
    out.put(dict(cache.stats.as_dict(), puts=cache.store_stats.puts))


def test_processes_of_a_node_decode_each_row_group_once(mixed, tmp_path):
    """Three processes reading the same row groups at the same time: one decodes each, the
    others wait on its lock and map what it wrote."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_read_all_at_once,
                         args=(mixed, str(tmp_path / "dc"), barrier, out)) for _ in range(3)]
    for p in procs:
        p.start()
    stats = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    n = open_dataset(mixed).manifest.num_row_groups
    assert sum(s["misses"] for s in stats) == sum(s["puts"] for s in stats) == n
    assert sum(s["hits"] for s in stats) == 2 * n



def test_mapped_tables_hold_no_file_descriptors_and_an_empty_entry_is_dropped(mixed, tmp_path):
    cache = DecodedDiskCache(tmp_path / "dc")
    _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    fds = len(os.listdir("/proc/self/fd"))
    held = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    assert cache.stats.hits >= len(held) > 5
    assert len(os.listdir("/proc/self/fd")) - fds < 5     # not one per live table
    path = _entries(cache)[0]
    open(path, "wb").close()
    again = DecodedDiskCache(tmp_path / "dc")
    _all_row_groups(open_dataset(mixed, decoded_cache=again))
    assert again.stats.corrupt == 1 and os.path.getsize(path) > 0   # dropped, written again


def _count_in_child(ds, out) -> None:
    _all_row_groups(ds)
    out.put(ds.decoded_cache.stats.hits + ds.decoded_cache.stats.misses)


def test_a_child_forked_while_a_thread_counts_does_not_deadlock(mixed, tmp_path):
    import multiprocessing as mp

    cache = DecodedDiskCache(tmp_path / "dc")
    ds = open_dataset(mixed, decoded_cache=cache)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    with cache._mutex:                      # as a decode thread counting at the fork
        p = ctx.Process(target=_count_in_child, args=(ds, out))
        p.start()
    assert out.get(timeout=60) == ds.manifest.num_row_groups
    p.join(timeout=30)
    assert p.exitcode == 0


def test_a_table_that_cannot_be_written_is_read_uncached(mixed, tmp_path, monkeypatch, caplog):
    def refuse(self, key, table):
        raise pa.ArrowNotImplementedError("no IPC for this type")

    monkeypatch.setattr(DecodedDiskCache, "put", refuse)
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc")
    got = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    assert all(g.equals(w) for g, w in zip(got, want))
    assert cache.stats.unwritable == len(want) and not _entries(cache)
    assert sum("could not be written" in r.getMessage() for r in caplog.records) == 1


def test_every_column_type_hits_on_the_next_read(tmp_path):
    """An entry is only served when its schema is the manifest's: a type whose decode
    differed from it would be decoded and rewritten on every read. None does."""
    import datetime
    import decimal

    n = 50
    pq.write_table(pa.table({
        "ts": pa.array([datetime.datetime(2020, 1, 1)] * n, pa.timestamp("s", tz="UTC")),
        "ns": pa.array(np.arange(n, dtype="int64"), pa.timestamp("ns")),
        "day": pa.array([datetime.date(2020, 1, 2)] * n, pa.date32()),
        "dec": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(10, 2)),
        "half": pa.array(np.arange(n, dtype="float16")),
        "flag": [i % 2 == 0 for i in range(n)],
        "rec": [{"a": i, "b": str(i)} for i in range(n)],
        "map": pa.array([[("k", i)] for i in range(n)], pa.map_(pa.string(), pa.int64())),
        "ll": pa.array([[i] * 3 for i in range(n)], pa.large_list(pa.int32())),
        "cat": pa.array(["p", "q"] * (n // 2)).dictionary_encode(),
        "u8": pa.array(np.arange(n) % 256, pa.uint8()),
    }), tmp_path / "in.parquet")
    convert([str(tmp_path / "in.parquet")], str(tmp_path / "ds"),
            options=WriteOptions(row_group_rows=20))
    want = _all_row_groups(open_dataset(str(tmp_path / "ds"), decoded_cache=tmp_path / "dc"))
    cache = DecodedDiskCache(tmp_path / "dc")
    got = _all_row_groups(open_dataset(str(tmp_path / "ds"), decoded_cache=cache))
    assert cache.stats.hits == len(want) == 3 and cache.stats.corrupt == 0
    assert all(g.equals(w) for g, w in zip(got, want))


def test_an_entry_copied_onto_another_key_is_never_served(mixed, tmp_path):
    """Issue 29, item 14: an entry file copied to another key's name (an rsync or restore
    slip, two caches merged) holds good bytes with a good hash, of the wrong row group."""
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc")
    ds = open_dataset(mixed, decoded_cache=cache)
    _all_row_groups(ds)
    rgs = ds.row_groups
    # Every row group of the same row count and schema gets the entry of the next one.
    pairs = [(a, b) for a, b in zip(range(len(want)), range(1, len(want)))
             if want[a].num_rows == want[b].num_rows]
    assert len(pairs) >= 5
    for a, b in pairs:
        shutil.copyfile(cache._store.entry_path(rgs.decoded_key(b)),
                        cache._store.entry_path(rgs.decoded_key(a)))
    fresh = DecodedDiskCache(tmp_path / "dc")
    got = _all_row_groups(open_dataset(mixed, decoded_cache=fresh))
    assert [g.equals(w) for g, w in zip(got, want)] == [True] * len(want)
    assert fresh.stats.corrupt == len(pairs) and fresh.store_stats.puts == len(pairs)
    last = DecodedDiskCache(tmp_path / "dc")          # rewritten under their own keys
    _all_row_groups(open_dataset(mixed, decoded_cache=last))
    assert last.stats.hits == len(want) and last.stats.corrupt == 0


def test_an_entry_whose_row_count_is_not_the_manifests_is_never_served(mixed, tmp_path):
    """An entry under the right key whose rows are not the row group's (same schema): it is
    checked against the manifest's row count, dropped, counted and decoded again."""
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc")
    rgs = open_dataset(mixed, decoded_cache=cache).row_groups
    assert cache.put(rgs.decoded_key(0), want[0].slice(0, want[0].num_rows - 1))
    assert cache.put(rgs.decoded_key(1), pa.concat_tables([want[1], want[1].slice(0, 1)]))
    assert cache.put(rgs.decoded_key(2), want[2].slice(0, 0))
    fresh = DecodedDiskCache(tmp_path / "dc")
    got = _all_row_groups(open_dataset(mixed, decoded_cache=fresh))
    assert [g.equals(w) for g, w in zip(got, want)] == [True] * len(want)
    assert fresh.stats.corrupt == 3 and fresh.stats.hits == 0
    assert DecodedDiskCache(tmp_path / "dc").get(rgs.decoded_key(0), want[0].schema,
                                                 rows=want[0].num_rows).equals(want[0])


def _first_format_entry(table: pa.Table) -> bytes:
    """An entry as the first format wrote it: IPC bytes, then magic, their xxh3, length."""
    import struct

    import xxhash

    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    body = sink.getvalue().to_pybytes()
    return body + struct.pack("<8s16sQ", b"ZPHDEC01", xxhash.xxh3_128(body).digest(), len(body))


def test_entries_of_the_first_format_are_misses_never_misread(mixed, tmp_path):
    """Entries written before the key was bound (format tag 1): under their old names they
    are never looked up; placed under a new name they fail the check. Either way the row
    group is decoded again and rewritten."""
    want = _all_row_groups(open_dataset(mixed, decoded_cache=False))
    cache = DecodedDiskCache(tmp_path / "dc")
    rgs = open_dataset(mixed, decoded_cache=cache).row_groups
    m = rgs.manifest
    old_key = xxh3_hex(b"\0".join((b"zephon-decoded-v1", m.shard_name(int(m.rg_shard[0])).encode(),
                                   str(m.rg_local_index(0)).encode(), rgs._fingerprint)))
    wrong = _first_format_entry(want[1].slice(0, want[0].num_rows))  # another row group's rows
    for key in (old_key, rgs.decoded_key(0)):
        path = cache._store.entry_path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(wrong)
    got = _all_row_groups(open_dataset(mixed, decoded_cache=cache))
    assert [g.equals(w) for g, w in zip(got, want)] == [True] * len(want)
    assert cache.stats.misses == len(want) and cache.stats.corrupt == 1
    again = DecodedDiskCache(tmp_path / "dc")
    assert again.get(rgs.decoded_key(0), want[0].schema, rows=want[0].num_rows).equals(want[0])


@pytest.mark.parametrize("value", ["0", "-1GiB", "lots"])
def test_a_bad_budget_in_the_environment_names_the_variable(mixed, tmp_path, monkeypatch, value):
    from zephon_store.read.decoded_disk import ENV_BUDGET

    monkeypatch.setenv(ENV_BUDGET, value)
    with pytest.raises(ValueError, match=r"\$ZEPHON_DECODED_CACHE_BUDGET="):
        DecodedDiskCache(tmp_path / "dc")
    monkeypatch.setenv(ENV_DIR, str(tmp_path / "env"))
    with pytest.raises(ValueError, match=r"\$ZEPHON_DECODED_CACHE_BUDGET="):
        open_dataset(mixed)
