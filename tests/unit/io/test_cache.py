"""ChunkCache: content keys, atomic publish, planned eviction, sharing across processes.

Assertions count entries, bytes and fetches; nothing is timed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import time

import pytest

from tests.helpers.faultproxy import cache_disk_full, cache_folder_vanishes, read_only_folder
from zephon_store._util.hashing import xxh3_hex
from zephon_store.errors import IntegrityError
from zephon_store.io.cache import ChunkCache, cache_clear, cache_info, default_cache_dir, parse_size


def blob(i: int, size: int = 100) -> tuple[str, bytes]:
    """Deterministic bytes number ``i`` and their key."""
    data = (f"blob-{i}-".encode() * size)[:size]
    return xxh3_hex(data), data


def files_under(directory) -> list[str]:
    return [os.path.join(d, f) for d, _, fs in os.walk(directory) for f in fs]


def age(cache: ChunkCache, keys: list[str]) -> None:
    """Give entries strictly increasing mtimes in the order of ``keys`` (oldest first)."""
    for n, key in enumerate(keys):
        os.utime(cache._entry_path(key), ns=(10**18 + n * 10**9, 10**18 + n * 10**9))


def test_put_get_round_trip_is_atomic_and_content_keyed(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=1 << 20)
    key, data = blob(1)
    assert cache.get(key) is None and not cache.contains(key)
    assert cache.put(key, data) is True
    assert cache.get(key) == data and cache.contains(key)
    # exactly one published file, no temp files left beside it
    objects = [p for p in files_under(tmp_path / "v1" / "objects")]
    assert [os.path.basename(p) for p in objects] == [key]
    assert cache.info()["entries"] == 1 and cache.info()["bytes"] == len(data)
    assert cache.stats.hits == 1 and cache.stats.misses == 1


def test_put_rejects_bytes_that_do_not_hash_to_the_key(tmp_path):
    cache = ChunkCache(tmp_path)
    key, _ = blob(1)
    with pytest.raises(IntegrityError, match="not to the key"):
        cache.put(key, b"other bytes")
    with pytest.raises(ValueError, match="xxh3-128 hex"):
        cache.get("../../etc/passwd")


def test_a_damaged_entry_is_dropped_not_served(tmp_path):
    cache = ChunkCache(tmp_path)
    key, data = blob(1)
    cache.put(key, data)
    with open(cache._entry_path(key), "r+b") as f:
        f.write(b"X")
    assert cache.get(key) is None
    assert cache.stats.corrupt == 1 and not cache.contains(key)
    assert cache.get_or_fetch(key, lambda: data) == data


def test_entry_larger_than_the_budget_is_not_cached(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=50)
    key, data = blob(1, size=100)
    assert cache.put(key, data) is False
    assert cache.get_or_fetch(key, lambda: data) == data
    assert cache.info()["entries"] == 0


def test_put_many_takes_the_cache_lock_once(tmp_path, monkeypatch):
    cache = ChunkCache(tmp_path, budget_bytes=10_000)
    cache.put(*blob(0))
    locks = []
    real = cache._cache_lock
    monkeypatch.setattr(cache, "_cache_lock", lambda: (locks.append(1), real())[1])
    items = [blob(i) for i in range(6)] + [blob(3)]  # one already cached, one repeated
    assert cache.put_many(items) == [True] * 7
    assert len(locks) == 1
    assert cache.stats.puts == 1 + 5
    assert cache._read_usage() == 600 == cache.info()["bytes"]
    assert all(cache.get(k) == d for k, d in items)
    assert cache.put_many([blob(0), blob(1)]) == [True, True] and len(locks) == 1  # all cached


def test_put_many_checks_every_hash_before_publishing(tmp_path):
    cache = ChunkCache(tmp_path)
    good, (bad_key, _) = blob(0), blob(1)
    with pytest.raises(IntegrityError, match="cache keys must be the xxh3"):
        cache.put_many([good, (bad_key, b"not these bytes")])
    assert cache.info()["entries"] == 0


def test_put_many_keeps_the_budget_and_the_plan(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=500, low_water=1.0)
    keys = [blob(i)[0] for i in range(8)]
    cache.set_future([keys[7], keys[6], keys[5], keys[4], keys[3]])   # 0-2 unplanned
    assert cache.put_many([blob(i) for i in range(8)] + [blob(9, size=600)]) == [True] * 8 + [
        False]  # 600 bytes exceed the whole budget
    assert {k for k in keys if cache.contains(k)} == set(keys[3:])
    assert cache.info()["bytes"] == 500 == cache._read_usage()


def test_claim_keys_skips_held_keys_and_get_or_fetch_waits_for_the_claim(tmp_path):
    import threading

    cache = ChunkCache(tmp_path)
    (k0, d0), (k1, d1) = blob(0), blob(1)
    fetched = []
    with cache.claim_keys([k0, k1, k0]) as mine:
        assert mine == {k0, k1}
        with cache.claim_keys([k1]) as other:
            assert other == set()          # held: skipped, not waited for
        t = threading.Thread(target=lambda: fetched.append(
            cache.get_or_fetch(k0, lambda: b"fetched a second time")))
        t.start()
        time.sleep(0.2)
        assert not fetched                 # blocked on the claim
        cache.put_many([(k0, d0), (k1, d1)])
    t.join(5)
    assert fetched == [d0]                 # served what the claimer published
    assert os.listdir(tmp_path / "v1" / "locks") == []
    with cache.claim_keys([k1]) as again:
        assert again == {k1}


def test_get_or_fetch_fetches_once(tmp_path):
    cache = ChunkCache(tmp_path)
    key, data = blob(1)
    calls = []
    fetch = lambda: calls.append(1) or data  # noqa: E731
    assert cache.get_or_fetch(key, fetch) == data
    assert cache.get_or_fetch(key, fetch) == data
    assert len(calls) == 1 and cache.stats.fetches == 1 and cache.stats.hits == 1


def test_eviction_takes_unplanned_keys_lru_first_then_the_furthest_planned(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=500, low_water=1.0)
    keys = [blob(i)[0] for i in range(8)]
    for i in range(5):
        cache.put(*blob(i))
    age(cache, [keys[2], keys[0], keys[1], keys[3], keys[4]])  # LRU order: 2, 0, 1, 3, 4
    cache.set_future([keys[5], keys[4], keys[1], keys[6], keys[3]])  # 0 and 2 unplanned

    cache.put(*blob(5))  # 600 > 500: the least recently used unplanned key goes
    assert not cache.contains(keys[2])
    cache.put(*blob(6))
    assert not cache.contains(keys[0])
    cache.put(*blob(7))  # a newcomer nobody planned is the first to go
    assert not cache.contains(keys[7])
    # Only planned keys left: Belady evicts the one needed furthest in the future (3).
    cache.set_future([keys[5], keys[7], keys[4], keys[1], keys[6], keys[3]])
    cache.put(*blob(7))
    assert {k for k in keys if cache.contains(k)} == {keys[1], keys[4], keys[5], keys[6], keys[7]}
    assert cache.info()["bytes"] <= 500
    assert cache.stats.evictions == 4


def test_belady_order_follows_the_plan(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=400, low_water=1.0)
    keys = [blob(i)[0] for i in range(6)]
    cache.set_future([keys[4], keys[0], keys[3], keys[1], keys[2], keys[5]])
    for i in range(4):
        cache.put(*blob(i))
    cache.put(*blob(4))  # furthest planned among {0,1,2,3,4} is 2
    assert [cache.contains(k) for k in keys[:5]] == [True, True, False, True, True]
    cache.put(*blob(5))  # 5 itself is furthest now
    assert not cache.contains(keys[5])
    assert cache.info()["entries"] == 4


def test_low_water_evicts_in_batches(tmp_path):
    cache = ChunkCache(tmp_path, budget_bytes=1000, low_water=0.5)
    for i in range(10):
        cache.put(*blob(i))
    assert cache.info()["bytes"] == 1000
    cache.put(*blob(10))
    assert cache.info()["bytes"] <= 500


def test_plans_of_other_processes_protect_their_keys(tmp_path):
    mine = ChunkCache(tmp_path, budget_bytes=300, low_water=1.0)
    other = ChunkCache(tmp_path, budget_bytes=300, low_water=1.0)  # stands for another rank
    keys = [blob(i)[0] for i in range(4)]
    for i in range(3):
        mine.put(*blob(i))
    age(mine, keys[:3])  # key 0 is the LRU one
    other.set_future([keys[0]])
    mine.put(*blob(3))
    assert mine.contains(keys[0]) and not mine.contains(keys[1])
    other.clear_future()
    assert mine.info()["plans"] == 0


def test_clear_and_module_helpers(tmp_path, monkeypatch):
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zc"))
    cache = ChunkCache()
    assert cache.directory == str(tmp_path / "zc")
    for i in range(3):
        cache.put(*blob(i))
    assert cache_info()["entries"] == 3 and cache_info()["bytes"] == 300
    assert cache_clear() == 300
    assert cache_info()["entries"] == 0 and cache.get(blob(0)[0]) is None
    # clear only touches our own layout directory
    (tmp_path / "zc" / "unrelated.txt").write_text("keep me")
    cache.clear()
    assert (tmp_path / "zc" / "unrelated.txt").exists()


def test_default_dir_and_budget_from_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ZEPHON_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "zephon")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "zephon")
    monkeypatch.setenv("ZEPHON_CACHE_BUDGET", "2MiB")
    assert ChunkCache(tmp_path).budget_bytes == 2 << 20
    assert parse_size("512m") == 512_000_000   # one convention: k/M/G/T are powers of 1000
    with pytest.raises(ValueError, match="not a byte size"):
        parse_size("lots")
    assert cache_info(str(tmp_path / "never-created"))["entries"] == 0
    assert not (tmp_path / "never-created").exists()


# -- a failing disk is bypassed, never fatal ------------------------------------------------

def exercise(cache: ChunkCache) -> None:
    """Every read-path operation; each must give right answers whatever the disk does."""
    keys = [blob(i) for i in range(4)]
    cache.set_future([k for k, _ in keys])
    for key, data in keys[:2]:
        assert cache.get_or_fetch(key, lambda data=data: data) == data
    with cache.claim_keys(k for k, _ in keys[2:]) as mine:
        assert mine == {k for k, _ in keys[2:]}        # no locks: the caller fetches them all
        cache.put_many(keys[2:])
    for key, data in keys:
        assert cache.get(key) in (None, data)


def cache_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zephon_store.io.cache"]


def test_a_cache_path_that_is_a_file_is_bypassed_with_one_warning(tmp_path, caplog):
    (tmp_path / "c").write_bytes(b"not a folder")
    cache = ChunkCache(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="zephon_store.io.cache"):
        exercise(cache)
        key, data = blob(9)
        assert cache.put(key, data) is False and cache.get(key) is None
    warned = cache_warnings(caplog)
    assert len(warned) == 1 and cache.stats.bypassed >= 4 and cache.stats.fetches == 2
    assert str(tmp_path / "c") in warned[0] and "Not a directory" in warned[0]
    assert "without caching" in warned[0] and "ZEPHON_CACHE_DIR" in warned[0]
    assert (tmp_path / "c").read_bytes() == b"not a folder"


def test_a_full_disk_leaves_no_temp_files_and_heals_when_space_returns(tmp_path, monkeypatch,
                                                                      caplog):
    cache = ChunkCache(tmp_path)
    cache_disk_full(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="zephon_store.io.cache"):
        exercise(cache)
    warned = cache_warnings(caplog)
    assert len(warned) == 1 and "No space left on device" in warned[0]
    assert cache.info()["entries"] == 0
    assert [n for n in files_under(tmp_path / "v1" / "objects") if ".tmp-" in n] == []
    monkeypatch.undo()   # space freed: the next write is cached again
    key, data = blob(1)
    assert cache.put(key, data) is True and cache.get(key) == data


def test_a_read_only_cache_still_serves_its_entries(tmp_path, caplog):
    cache = ChunkCache(tmp_path / "c")
    (k0, d0), (k1, d1) = blob(0), blob(1)
    cache.put_many([(k0, d0), (k1, d1)])
    with open(cache._entry_path(k1), "r+b") as f:   # a damaged entry it cannot drop
        f.write(b"X")
    with read_only_folder(tmp_path / "c"), caplog.at_level(logging.WARNING,
                                                           logger="zephon_store.io.cache"):
        exercise(ChunkCache(tmp_path / "c"))
        ro = ChunkCache(tmp_path / "c")
        assert ro.get_or_fetch(k0, lambda: b"never fetched") == d0 and ro.stats.fetches == 0
        assert ro.get(k1) is None and ro.get_or_fetch(k1, lambda: d1) == d1
        assert ro.stats.corrupt == 2
    warned = cache_warnings(caplog)
    assert len(warned) == 2   # once per cache object
    assert all(str(tmp_path / "c") in w and ("Read-only file system" in w
                                             or "Permission denied" in w) for w in warned)


def test_a_folder_deleted_while_an_entry_is_written(tmp_path, monkeypatch, caplog):
    cache = ChunkCache(tmp_path / "c")
    cache_folder_vanishes(monkeypatch, tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="zephon_store.io.cache"):
        exercise(cache)
    warned = cache_warnings(caplog)
    assert len(warned) == 1 and "No such file or directory" in warned[0]
    monkeypatch.undo()
    key, data = blob(1)
    assert cache.get_or_fetch(key, lambda: data) == data and cache.get(key) == data


def test_errors_of_the_fetch_are_not_swallowed(tmp_path):
    (tmp_path / "c").write_bytes(b"")
    cache = ChunkCache(tmp_path / "c")

    def fetch():
        raise ConnectionResetError("storage failed, not the cache")

    with pytest.raises(ConnectionResetError):
        cache.get_or_fetch(blob(0)[0], fetch)
    with pytest.raises(IntegrityError):      # a caller's wrong key is a bug, not a disk fault
        cache.put(blob(0)[0], b"other bytes")


# -- several processes on one cache directory -----------------------------------------------

def _fits_worker(directory: str, log: str, seed: int) -> int:
    cache = ChunkCache(directory, budget_bytes=1 << 20)
    order = list(range(16))
    random.Random(seed).shuffle(order)
    for i in order:
        key, data = blob(i, size=2000)

        def fetch(key=key, data=data):
            with open(log, "a") as f:
                f.write(key + "\n")  # one small O_APPEND write: atomic
            time.sleep(0.03)  # a slow fetch, so the workers' fetches overlap
            return data

        got = cache.get_or_fetch(key, fetch)
        assert xxh3_hex(got) == key
    return cache.stats.fetches


def _hammer_worker(directory: str, seed: int) -> int:
    rng = random.Random(seed)
    cache = ChunkCache(directory, budget_bytes=48 << 10, low_water=0.75)
    table = [blob(i, size=1000 + 997 * i % 11000) for i in range(40)]
    checked = 0
    for step in range(300):
        key, data = table[rng.randrange(len(table))]
        op = rng.random()
        if step % 50 == 0:
            cache.set_future([table[rng.randrange(len(table))][0] for _ in range(8)])
        if op < 0.7:
            got = cache.get_or_fetch(key, lambda data=data: data)
        elif op < 0.8:
            cache.put(key, data)
            got = data
        elif op < 0.9:  # a coalesced range: claim what is free, publish it in one go
            some = [table[rng.randrange(len(table))] for _ in range(4)]
            with cache.claim_keys(k for k, _ in some) as mine:
                cache.put_many((k, d) for k, d in some if k in mine)
            got = data
        else:
            got = cache.get(key)
        if got is not None:
            if xxh3_hex(got) != key:
                raise AssertionError(f"corrupt value for {key}")
            checked += 1
    return checked


def test_processes_sharing_a_cache_fetch_each_key_once(tmp_path):
    log = tmp_path / "fetches.log"
    log.touch()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        fetches = pool.starmap(_fits_worker, [(str(tmp_path / "c"), str(log), s)
                                              for s in range(4)])
    fetched = log.read_text().split()
    assert sorted(fetched) == sorted(blob(i, size=2000)[0] for i in range(16))
    assert sum(fetches) == 16


def test_processes_hammering_a_small_cache_never_see_partial_entries(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        checked = pool.starmap(_hammer_worker, [(str(tmp_path), s) for s in range(4)])
    assert all(c > 0 for c in checked)
    names = []
    for path in files_under(tmp_path / "v1" / "objects"):
        name = os.path.basename(path)
        assert not name.startswith("."), f"temp file left behind: {path}"
        with open(path, "rb") as f:
            assert xxh3_hex(f.read()) == name
        names.append(name)
    info = ChunkCache(tmp_path, budget_bytes=48 << 10).info()
    assert info["entries"] == len(names)
    assert info["bytes"] <= 48 << 10
    assert info["plans"] == 0  # each worker's plan went away with it
    assert not os.listdir(tmp_path / "v1" / "locks")
