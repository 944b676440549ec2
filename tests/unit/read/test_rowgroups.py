"""The read path's owners: the cache argument, pickling, fork safety, closing, and the
range fetcher's seam (callables and a cache, no Dataset)."""

from __future__ import annotations

import os
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.helpers import converted
from zephon_store import open_dataset
from zephon_store.format.manifest import load_manifest
from zephon_store.io.cache import ChunkCache
from zephon_store.io.coalesce import RangeFetcher
from zephon_store.io.storage import Storage


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("rowgroups"), files=2, records=300, seed=3,
                     target_shard_bytes=60 << 10, row_group_bytes=4 << 10)


@pytest.mark.parametrize("cache, hint", [
    (True, "pass cache=ChunkCache() for the default disk cache"),
    (42, "got 42"),
])
def test_cache_is_a_chunk_cache_none_or_false_and_anything_else_says_what_to_pass(
        local_ds, cache, hint):
    with pytest.raises(TypeError, match="cache must be a ChunkCache") as e:
        open_dataset(local_ds, cache=cache)
    assert hint in str(e.value)


def test_a_folder_path_is_shorthand_for_a_chunk_cache(local_ds, tmp_path):
    ds = open_dataset(local_ds, cache=str(tmp_path / "zc"))
    assert isinstance(ds.cache, ChunkCache) and ds.cache.directory == str(tmp_path / "zc")
    ds.take([0, 5])
    assert ds.cache.stats.misses + ds.cache.stats.fetches > 0


def test_none_reads_a_local_dataset_in_place_and_a_chunk_cache_is_used_as_given(local_ds,
                                                                                 tmp_path):
    assert open_dataset(local_ds).cache is None
    assert open_dataset(local_ds, cache=False).cache is None
    cache = ChunkCache(str(tmp_path / "c"), budget_bytes=1 << 20)
    ds = open_dataset(local_ds, cache=cache)
    assert ds.cache is cache
    ds.take([0, 5])
    assert cache.stats.misses + cache.stats.fetches > 0   # the bytes went through it


def test_a_pickled_dataset_gets_a_fresh_cache_with_the_same_folder_and_budget(local_ds,
                                                                            tmp_path):
    cache = ChunkCache(str(tmp_path / "c"), budget_bytes=3 << 20, low_water=0.5)
    ds = open_dataset(local_ds, cache=cache)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.cache is not cache
    assert (copy.cache.directory, copy.cache.budget_bytes, copy.cache.low_water) == (
        cache.directory, 3 << 20, 0.5)
    assert copy.take([1]).to_pylist() == ds.take([1]).to_pylist()


def test_close_closes_the_prefetchers_made_for_the_dataset(local_ds, tmp_path):
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    pre = ds.row_groups.prefetcher(lambda i: [i % m.num_row_groups], num_batches=None)
    assert pre.enabled
    ds.close()
    with pytest.raises(RuntimeError):   # its pool was shut down
        pre._pool.submit(int)
    assert ds.take([3]).num_rows == 1   # still usable


def test_a_local_dataset_makes_no_prefetcher_work(local_ds):
    ds = open_dataset(local_ds)
    pre = ds.row_groups.prefetcher(lambda i: [0], num_batches=4)
    assert not pre.enabled and pre._pool is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_a_parent_thread_holds_a_lock_does_not_hang_the_child(local_ds):
    """Every lock of the read path is new in a forked child (os.register_at_fork): a lock a
    parent thread held at the fork would otherwise never be released there."""
    ds = open_dataset(local_ds)
    ds.take([0])
    rgs = ds.row_groups
    held = [rgs._decoding._lock, rgs.footers._lock, rgs._owned_lock]
    for lock in held:
        lock.acquire()
    try:
        pid = os.fork()
        if pid == 0:   # child: new shards' footers, new decodes, the pool
            try:
                rows = ds.take(np.arange(0, ds.num_samples, 7)).num_rows
                os._exit(0 if rows == len(range(0, ds.num_samples, 7)) else 1)
            except BaseException:
                os._exit(2)
    finally:
        for lock in held:
            lock.release()
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on a lock held by the parent at the fork")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_range_fetcher_needs_only_callables_and_a_cache(local_ds, tmp_path):
    """No Dataset: a manifest, a read_range callable, a cache and a fetch_alone callable."""
    storage = Storage(local_ds)
    m = load_manifest(storage)
    reads, alone, corrupt = [], [], []

    def read_range(relpath, start, end, *, what):
        reads.append((relpath, start, end))
        data = bytearray(storage.read_range(relpath, start, end, what=what))
        if start <= int(m.rg_offset[1]) < end:     # damage row group 1 inside its range
            data[int(m.rg_offset[1]) - start] ^= 0xFF
        return bytes(data)

    def fetch_alone(rg):
        alone.append(rg)
        return storage.read_range(m.shard_path(int(m.rg_shard[rg])), int(m.rg_offset[rg]),
                                  int(m.rg_offset[rg]) + int(m.rg_length[rg]),
                                  expected_xxh3=m.rg_xxh3(rg), what="alone")

    cache = ChunkCache(str(tmp_path / "c"))
    fetcher = RangeFetcher(m, read_range, cache, fetch_alone=fetch_alone,
                           on_corrupt=corrupt.append)
    fetcher.hold(1 << 20)    # verified pieces wait in memory for their reader
    rgs = [int(r) for r in np.flatnonzero(m.rg_shard == 0)[:4]]
    with ThreadPoolExecutor(1) as pool:
        [f.result() for f in fetcher.submit(fetcher.coalesce(rgs), pool)]
    assert len(reads) == 1 and fetcher.ranges == 1        # one ranged read for four
    assert alone == [1] and corrupt == [1] and fetcher.refetched == 1
    assert all(cache.contains(m.rg_xxh3(r)) for r in rgs if r != 1)
    plain = open_dataset(local_ds)
    assert fetcher.take(rgs[0]) == plain.row_groups.fetch_bytes(rgs[0])
    assert fetcher.take(rgs[0]) is None     # taken once, then gone


def test_a_footer_asked_for_by_many_threads_is_fetched_once(local_ds):
    ds = open_dataset(local_ds)
    calls = []
    real = ds.storage.read_range

    def counting(relpath, start, end, **kw):
        calls.append((relpath, start))
        time.sleep(0.01)   # widen the window in which the threads overlap
        return real(relpath, start, end, **kw)

    ds.storage.read_range = counting
    barrier = threading.Barrier(6)

    def one():
        barrier.wait()
        return ds.row_groups.footers.get(0)

    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda _: one(), range(6)))
    assert len(calls) == 1 and all(g is got[0] for g in got)
