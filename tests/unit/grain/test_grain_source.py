"""ZephonSource: a dataset or mixture as Grain's random-access source, in real Grain pipelines."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import grain
import numpy as np
import pytest
from grain._src.python.dataset.base import SupportsBatchedReadRandomAccessDataSource

from tests.helpers import small_dataset
from zephon_store import (
    BatchOptions,
    IntegrityError,
    OrderOptions,
    ReadAheadOptions,
    SourceOptions,
    StopOptions,
    Topology,
    open_dataset,
)
from zephon_store.grain import ZephonSource
from zephon_store.load.loader import Loader

N = 303


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    return small_dataset(str(tmp_path_factory.mktemp("grain_source")), files=3, records=101,
                         row_group_rows=10)


@pytest.fixture(scope="module")
def mixture(tmp_path_factory, url):
    root = str(tmp_path_factory.mktemp("grain_mix"))
    other = small_dataset(root, files=1, records=80, row_group_rows=8, seed=5)
    doc = {"stages": [{"name": "a", "start": {"samples": 0}},
                      {"name": "b", "start": {"samples": 90}}],
           "sources": [{"name": "web", "url": url, "weights": {"a": 0.75, "b": 0.25}},
                       {"name": "code", "url": other, "weights": {"a": 0.25, "b": 0.75}}]}
    path = os.path.join(root, "mix.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def plain(records: list[dict]) -> list[dict]:
    """Records with numpy values as Python ones (comparable with ``==``)."""
    return [{k: v.tolist() if isinstance(v, (np.ndarray, np.generic)) else v
             for k, v in r.items()} for r in records]


def test_records_are_the_datasets_rows(url):
    src = ZephonSource(url)
    assert len(src) == N and isinstance(src, grain.sources.RandomAccessDataSource)
    assert isinstance(src, SupportsBatchedReadRandomAccessDataSource)
    idx = [5, 302, 0, 5, 150, 11]
    want = open_dataset(url).take(idx).to_pylist()
    got = src._getitems(idx)
    assert plain(got) == want
    # Lists (here "tags") come as numpy arrays: Grain batches them as leaves.
    assert all(isinstance(r["tags"], np.ndarray) for r in got)
    assert plain(src.__getitems__(idx)) == want
    assert plain([src[i] for i in idx]) == want


def test_a_batched_read_decodes_each_row_group_once(url, monkeypatch):
    src = ZephonSource(url)
    reads = []
    real = src.source.read_row_group
    monkeypatch.setattr(src.source, "read_row_group",
                        lambda rg, **kw: reads.append(rg) or real(rg, **kw))
    idx = list(range(40, 80)) + [45, 41]           # 42 indices in row groups 4..7
    src._getitems(idx)
    assert sorted(reads) == [4, 5, 6, 7]


def test_read_batch_is_one_columnar_batch_in_a_grain_pipeline(url, monkeypatch):
    src = ZephonSource(url, columns=["id", "score", "tags"], with_seq=True)
    batch = src.read_batch([40, 3, 77])
    assert batch["id"].tolist() == batch["_seq"].tolist() == [40, 3, 77]
    assert batch["score"].dtype == np.float64 and isinstance(batch["tags"], list)
    # Index batches mapped to read_batch: Grain's shuffle and batching, one read per batch.
    reads = []
    real = src.source.read_row_group
    monkeypatch.setattr(src.source, "read_row_group",
                        lambda rg, **kw: reads.append(rg) or real(rg, **kw))
    by_batch = grain.MapDataset.range(N).shuffle(seed=2).batch(32).map(src.read_batch)
    by_record = grain.MapDataset.source(src).shuffle(seed=2).map(lambda r: r["id"]).batch(32)
    first = by_batch[0]
    assert len(reads) == len(set(reads)) == len(set((first["id"] // 10).tolist()))
    assert first["id"].tolist() == by_record[0].tolist()
    assert len(reads) > 2 * len(set(reads))          # record by record: a read per record


def test_out_of_range_and_bool_indices_are_refused(url):
    src = ZephonSource(url)
    with pytest.raises(IndexError, match=r"index 303 is out of range .* \[0, 303\)"):
        src[N]
    with pytest.raises(IndexError, match="index -1"):
        src._getitems([0, -1])
    with pytest.raises(TypeError, match="not bool"):
        src[True]


def test_indexed_by_zephons_order_it_reads_what_the_loader_reads(url):
    options = OrderOptions(seed=7, lanes=1)
    src = ZephonSource(url, order=options, with_seq=True)
    loader = Loader(url, topology=Topology(50), order=options,
                    batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=3))
    want = [i for b in loader for i in b["_seq"].tolist()]
    assert [int(r["_seq"]) for r in src._getitems(range(150))] == want


def test_a_mixture_indexed_by_its_order_crosses_its_stage_change(mixture):
    options = OrderOptions(seed=3, lanes=1)
    src = ZephonSource(mixture, order=options, with_seq=True)
    loader = Loader(mixture, topology=Topology(30), order=options,
                    batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=6))
    want = [(int(k), int(i)) for b in loader for k, i in zip(b["_source"], b["_seq"])]
    got = [(int(r["_source"]), int(r["_seq"])) for r in src._getitems(range(180))]
    assert got == want
    # Stage "a" (3:1) before position 90, stage "b" (1:3) after it.
    assert sum(k == 0 for k, _ in got[:88]) > sum(k == 1 for k, _ in got[:88])
    assert sum(k == 1 for k, _ in got[92:]) > sum(k == 0 for k, _ in got[92:])


def test_a_mixture_with_stages_in_steps_needs_the_global_batch(mixture, tmp_path):
    with open(mixture) as f:
        doc = json.load(f)
    doc["stages"][1]["start"] = {"steps": 3}
    path = str(tmp_path / "steps.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    with pytest.raises(Exception, match="needs global_batch"):
        ZephonSource(path, order=OrderOptions(seed=3, lanes=1))
    src = ZephonSource(path, order=OrderOptions(seed=3, lanes=1), global_batch=30)
    same = ZephonSource(mixture, order=OrderOptions(seed=3, lanes=1))   # stage 2 at 90 = 3 * 30
    assert plain(src._getitems(range(120))) == plain(same._getitems(range(120)))


def test_a_mixture_by_id_is_its_sources_concatenated(mixture, url):
    src = ZephonSource(mixture, with_seq=True)
    assert len(src) == N + 80
    r = src[N + 3]
    assert (int(r["_source"]), int(r["_seq"])) == (1, 3)
    assert int(src[7]["id"]) == open_dataset(url)[7]["id"]


def test_columns_are_selected_and_checked(url):
    assert list(ZephonSource(url, columns=["id", "score"])[4]) == ["id", "score"]
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in"):
        ZephonSource(url, columns=["nope"])


def test_length_needs_an_order(url):
    with pytest.raises(ValueError, match="pass order=OrderOptions"):
        ZephonSource(url, length=10)


def test_in_a_grain_map_dataset_pipeline(url):
    src = ZephonSource(url)
    ds = grain.MapDataset.source(src).shuffle(seed=1).map(lambda r: r["id"]).batch(8)
    perm = grain.MapDataset.range(N).shuffle(seed=1)
    assert ds[0].tolist() == [perm[i] for i in range(8)]
    ids = np.concatenate([ds[i] for i in range(len(ds))])
    assert sorted(ids.tolist()) == list(range(N))


def test_grain_reads_it_from_many_threads(url):
    src = ZephonSource(url, order=OrderOptions(seed=4, lanes=1), columns=["id"])
    want = [int(r["id"]) for r in src._getitems(range(N))]
    ds = (grain.MapDataset.source(ZephonSource(url, order=OrderOptions(seed=4, lanes=1),
                                               columns=["id"]))
          .batch(3).map(lambda b: b["id"].tolist())
          .to_iter_dataset(grain.ReadOptions(num_threads=8, prefetch_buffer_size=32)))
    assert [i for b in ds for i in b] == want


def _ids(batch):
    return batch["id"].tolist()


def _grain_loader(src, workers: int):
    """Grain's own DataLoader over ``src``: Grain's sampler (a shuffle), batches of 16."""
    return grain.DataLoader(
        data_source=src, operations=[grain.transforms.Batch(16, drop_remainder=True)],
        sampler=grain.samplers.IndexSampler(N, shuffle=True, seed=2, num_epochs=1,
                                            shard_options=grain.sharding.NoSharding()),
        worker_count=workers)


def test_in_grain_dataloader_with_process_workers(url):
    src = ZephonSource(url, columns=["id"])
    plain = [_ids(b) for b in _grain_loader(src, 0)]
    two = [_ids(b) for b in _grain_loader(src, 2)]
    # Grain's DataLoader batches within each worker's strided share, so its batches depend
    # on worker_count (ZephonIterDataset's do not); the records read are the same.
    assert len(two) == len(plain) == N // 16
    assert sorted(sum(two, [])) == sorted(sum(plain, []))
    # Grain's own checkpoint names the source by its repr: the data's identity.
    it = iter(_grain_loader(src, 0))
    next(it)
    assert src.source.dataset_id in json.loads(it.get_state())["data_source"]


def test_pickled_copies_read_the_same(url):
    src = ZephonSource(url, order=OrderOptions(seed=1, lanes=1))
    src._getitems([1, 200])
    copy = pickle.loads(pickle.dumps(src))
    assert plain(copy._getitems(range(30))) == plain(src._getitems(range(30)))
    assert repr(copy) == repr(src)


def test_every_byte_is_verified(url, tmp_path):
    bad = str(tmp_path / "ds")
    shutil.copytree(url, bad)
    m = open_dataset(bad).manifest
    path = os.path.join(bad, m.shard_path(int(m.rg_shard[1])))
    data = bytearray(open(path, "rb").read())
    data[int(m.rg_offset[1]) + 3] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    src = ZephonSource(bad)
    assert int(src[0]["id"]) == 0                    # row group 0 is intact
    with pytest.raises(IntegrityError, match="row group"):
        src._getitems([0, 12])


def test_the_decoded_cache_serves_a_later_source(url, tmp_path):
    """Through the node's decoded cache a second source over the same data decodes nothing
    and reads the same records."""
    got, stats = [], []
    for _ in range(2):
        src = ZephonSource(url, order=OrderOptions(seed=3, lanes=1),
                           source=SourceOptions(decoded_cache=tmp_path / "decoded"))
        got.append(plain(src._getitems(range(N))))
        stats.append(src.source.decoded_cache.stats)
        src.close()
    assert got[0] == got[1]
    assert stats[0].misses > 0 and stats[1].misses == 0 and stats[1].hits > 0


def test_a_run_log_is_refused_in_one_line(url, tmp_path):
    """Grain's sampler decides which index a step reads, so this source cannot log a run;
    ZephonIterDataset (Zephon's order and steps) does."""
    with pytest.raises(TypeError, match="ZephonIterDataset"):
        ZephonSource(url, run_log=str(tmp_path / "run.jsonl"))


def test_grains_checkpoint_refuses_another_worker_count(url):
    """An elastic resume is ZephonIterDataset's: over this source, Grain's DataLoader keeps
    Grain's checkpoint, which refuses another worker count (docs/grain.md)."""
    src = ZephonSource(url, columns=["id"])
    it = iter(_grain_loader(src, 0))
    next(it)
    other = iter(_grain_loader(src, 2))
    with pytest.raises(ValueError, match="[Ww]orker count"):
        other.set_state(it.get_state())


def _spy_decodes(src, monkeypatch) -> list[tuple[int, str]]:
    """Every row-group decode of ``src``'s dataset: (row group, the thread that ran it)."""
    import threading

    seen: list[tuple[int, str]] = []
    rows = src.source.row_groups
    real = rows._decode
    monkeypatch.setattr(rows, "_decode", lambda rg: seen.append(
        (rg, threading.current_thread().name)) or real(rg))
    return seen


def _drain(src) -> None:
    """Wait for the decodes ``src`` queued ahead (its threads), keeping what they decoded
    (``close`` would drop it)."""
    pool, src._pool = src._pool, None
    if pool is not None:
        pool.shutdown(wait=True)


def test_indexed_by_order_the_next_row_groups_are_decoded_ahead(url, monkeypatch):
    """In Zephon's order the source knows what comes next: after the first record its
    threads decode the row groups of the following positions, each once; read in order,
    the whole pass then decodes every row group once, and reads what a source without
    decode-ahead reads."""
    options = OrderOptions(seed=4, window_blocks=2, lanes=1)
    src = ZephonSource(url, order=options, columns=["id"],
                       read_ahead=ReadAheadOptions(decode_ahead_bytes=32 << 20))
    seen = _spy_decodes(src, monkeypatch)
    first = int(src[0]["id"])
    _drain(src)
    ahead = {rg for rg, thread in seen if thread.startswith("zephon-grain")}
    nxt = set(src.source.row_group_of(src._order.sample_at(np.arange(1, 40))).tolist())
    assert ahead and ahead <= set(range(src.source.row_group_table.num_row_groups))
    assert nxt - {rg for rg, _ in seen} == set()      # the next positions' row groups
    got = [first] + [int(src[p]["id"]) for p in range(1, N)]
    _drain(src)
    assert sorted(rg for rg, _ in seen) == list(range(src.source.row_group_table.num_row_groups))
    plain_src = ZephonSource(url, order=options, columns=["id"],
                             read_ahead=ReadAheadOptions(decode_ahead_bytes=0))
    assert got == [int(plain_src[p]["id"]) for p in range(N)]


def test_decode_ahead_is_bounded_and_can_be_turned_off(url, monkeypatch):
    src = ZephonSource(url, order=OrderOptions(seed=4, lanes=1), columns=["id"],
                       read_ahead=ReadAheadOptions(decode_ahead_bytes=1))
    assert src._ahead.row_groups == 1                 # one row group's worth at most
    off = ZephonSource(url, order=OrderOptions(seed=4, lanes=1),
                       read_ahead=ReadAheadOptions(decode_ahead_bytes=0))
    seen = _spy_decodes(off, monkeypatch)
    off[0]
    _drain(off)
    assert off._ahead is None and len(seen) == 1      # only the row group asked for
    by_id = ZephonSource(url)                         # by sample id: Grain picks what is next
    assert by_id._ahead is None
    # A local source does not decode ahead unless asked (it gained nothing, docs/benchmarks.md);
    # a remote one does (tests/integration/test_grain_s3.py).
    assert ZephonSource(url, order=OrderOptions(seed=4, lanes=1))._ahead is None
