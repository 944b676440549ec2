"""Coalesced ranged reads: the planning rules (hypothesis) and the fetcher on a local dataset
read through a disk cache (requests counted, bytes checked against a cache-less read)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import converted, sequential_steps
from zephon_store import IntegrityError, open_dataset
from zephon_store.errors import RetriesExhaustedError
from zephon_store.io.cache import ChunkCache
from zephon_store.io.coalesce import CoalesceOptions, RowGroupSpan, coalesce_ranges
from zephon_store.io.retry import RetryPolicy


@st.composite
def layouts(draw):
    """Row groups of a few shards: non-overlapping, increasing offsets, random gaps."""
    spans = []
    rg = 0
    for shard in range(draw(st.integers(1, 4))):
        off = draw(st.integers(0, 100))
        for _ in range(draw(st.integers(0, 12))):
            length = draw(st.integers(1, 300))
            spans.append(RowGroupSpan(rg, off, length, shard))
            rg += 1
            off += length + draw(st.sampled_from([0, 0, 0, 1, 10, 50, 200]))
    order = draw(st.permutations(spans))
    repeats = draw(st.lists(st.sampled_from(spans), max_size=5)) if spans else []
    return spans, list(order) + repeats


@settings(max_examples=300, deadline=None)
@given(layout=layouts(), max_bytes=st.integers(1, 1500), max_gap=st.integers(0, 100))
def test_coalesce_ranges_rules(layout, max_bytes, max_gap):
    spans, requested = layout
    by_rg = {s.rg: s for s in spans}
    ranges = coalesce_ranges(requested, max_bytes=max_bytes, max_gap=max_gap)
    covered = [rg for r in ranges for rg in r.row_groups]
    assert sorted(covered) == sorted({s.rg for s in requested})  # each exactly once
    for r in ranges:
        members = [by_rg[rg] for rg in r.row_groups]
        assert {s.shard for s in members} == {r.shard}                 # one shard only
        assert r.start == members[0].offset
        assert r.end == members[-1].offset + members[-1].length
        assert r.nbytes <= max_bytes or len(members) == 1              # size cap
        for a, b in zip(members, members[1:]):
            assert 0 <= b.offset - (a.offset + a.length) <= max_gap    # gap rule, no overlap
    # Soonest first: the ranges come in the order of their first requested row group.
    first = {}
    for i, s in enumerate(requested):
        first.setdefault(s.rg, i)
    keys = [min(first[rg] for rg in r.row_groups) for r in ranges]
    assert keys == sorted(keys)


@settings(max_examples=100, deadline=None)
@given(layout=layouts(), max_gap=st.integers(0, 100))
def test_coalesce_ranges_merges_every_mergeable_neighbour(layout, max_gap):
    """With no size cap, consecutive requested row groups of a shard within the gap share a
    range: the planner never splits where the rules allow a merge."""
    spans, requested = layout
    ranges = coalesce_ranges(requested, max_bytes=1 << 40, max_gap=max_gap)
    where = {rg: i for i, r in enumerate(ranges) for rg in r.row_groups}
    chosen = sorted({s for s in requested}, key=lambda s: (s.shard, s.offset))
    for a, b in zip(chosen, chosen[1:]):
        if a.shard == b.shard and 0 <= b.offset - (a.offset + a.length) <= max_gap:
            assert where[a.rg] == where[b.rg]


def test_options_are_validated():
    with pytest.raises(ValueError, match="max_gap must be >= 0, got -1"):
        CoalesceOptions(max_gap=-1)


# -- the fetcher, on a local dataset read through a disk cache ----------------------------


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("coalesce"), files=2, records=400, seed=3,
                     target_shard_bytes=60 << 10, row_group_bytes=4 << 10)


def _drain(ds, pre, steps):
    """Read each step's row groups as a reader would, telling the prefetcher as it goes."""
    out = []
    for i in range(steps):
        out += [ds.row_groups.fetch_bytes(int(rg)) for rg in pre.step_row_groups(i)]
        pre.consumed(i)
    return out


def _indexed(ds):
    """``ds`` with its whole row-group index fetched: format v4 fetches a chunk of it on
    first use, and these tests count the requests for row groups only."""
    if ds.manifest.details is not None:
        ds.manifest.details.load_all()
    return ds


def test_sequential_prefetch_reads_whole_shards_in_few_requests(local_ds, tmp_path):
    plain = open_dataset(local_ds)
    m = plain.manifest
    assert m.num_row_groups >= 20 and m.num_shards >= 2
    want = [plain.row_groups.fetch_bytes(rg) for rg in range(m.num_row_groups)]
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    opened = _indexed(ds).storage.stats.requests  # the manifest and its index
    steps = -(-m.num_row_groups // 2)
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
    got = _drain(ds, pre, steps)
    pre.close()
    assert got == want
    # The first step is planned alone (the first batch waits for its own row groups only),
    # then one range per shard (each far below 8 MiB); no row group is fetched alone.
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher.ranges == m.num_shards + 1 and fetcher.row_groups == m.num_row_groups
    assert ds.storage.stats.requests - opened == m.num_shards + 1
    assert ds.cache.info()["entries"] == m.num_row_groups


def test_small_ranges_respect_the_size_cap(local_ds, tmp_path):
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    cap = 3 * int(m.rg_length.max())
    opened = _indexed(ds).storage.stats.bytes_fetched
    steps = -(-m.num_row_groups // 2)
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps,
                     coalesce=CoalesceOptions(max_bytes=cap))
    _drain(ds, pre, steps)
    pre.close()
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher.row_groups == m.num_row_groups
    assert m.num_shards < fetcher.ranges <= m.num_row_groups // 2 + m.num_shards
    # contiguous row groups: no gap bytes, nothing read twice
    assert ds.storage.stats.bytes_fetched - opened == int(m.rg_length.sum())


def test_a_corrupt_row_group_in_a_range_is_refetched_alone_and_named(local_ds, tmp_path):
    import shutil

    copy = tmp_path / "ds"
    shutil.copytree(local_ds, copy)
    ds = open_dataset(str(copy), cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    rg = int(np.flatnonzero(m.rg_shard == 0)[3])  # inside the first shard's range
    path = os.path.join(str(copy), m.shard_path(0))
    data = bytearray(open(path, "rb").read())
    data[int(m.rg_offset[rg]) + 7] ^= 0x01
    open(path, "wb").write(bytes(data))
    steps = -(-m.num_row_groups // 2)
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
    with pytest.raises(IntegrityError) as e:
        _drain(ds, pre, steps)
    pre.close()
    msg = str(e.value)
    assert m.shard_name(0) in msg and f"row group {m.rg_local_index(rg)}:" in msg
    assert e.value.expected == m.rg_xxh3(rg)
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher.refetched >= 1
    # the good row groups of that range were cached; the bad one never was
    assert ds.cache.contains(m.rg_xxh3(rg - 1)) and not ds.cache.contains(m.rg_xxh3(rg))


def test_a_second_pass_fetches_nothing_and_a_second_process_cache_is_shared(local_ds, tmp_path):
    cache_dir = str(tmp_path / "c")
    ds = open_dataset(local_ds, cache=ChunkCache(cache_dir))
    opened = _indexed(ds).storage.stats.requests
    m = ds.manifest
    steps = -(-m.num_row_groups // 2)
    for _ in range(2):
        pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
        _drain(ds, pre, steps)
        pre.close()
    assert ds.storage.stats.requests - opened == m.num_shards + 1
    other = open_dataset(local_ds, cache=ChunkCache(cache_dir))
    opened = _indexed(other).storage.stats.requests
    pre = other.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
    _drain(other, pre, steps)
    pre.close()
    assert other.storage.stats.requests == opened


def test_claimed_keys_are_left_to_their_holder(local_ds, tmp_path):
    """A range skips row groups whose key lock someone else holds (another process fetching
    them); the reader then waits for that holder through the cache, not a second GET."""
    cache = ChunkCache(str(tmp_path / "c"))
    ds = open_dataset(local_ds, cache=cache)
    m = ds.manifest
    fetcher = ds.row_groups.range_fetcher(CoalesceOptions(max_gap=0))  # no reading across the hole
    taken = [int(r) for r in np.flatnonzero(m.rg_shard == 0)[:4]]
    with cache.claim_keys([m.rg_xxh3(taken[1])]) as held:
        assert held == {m.rg_xxh3(taken[1])}
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            futs = fetcher.submit(fetcher.coalesce(taken), pool)
            [f.result() for f in futs]
        assert fetcher.take(taken[1]) is None
        assert fetcher.ranges == 2   # split around the claimed row group
    assert ds.row_groups.fetch_bytes(taken[1]) == open_dataset(local_ds).row_groups.fetch_bytes(
        taken[1])


def test_an_endless_stream_over_a_small_dataset_still_reads_ranges(local_ds, tmp_path):
    """Planning stops at the horizon, not the budget, here: that must not submit each new
    step's row group as a range of its own."""
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    n = m.num_row_groups
    opened = _indexed(ds).storage.stats.requests
    pre = ds.row_groups.prefetcher(lambda i: [i % n], num_batches=None)   # one row group per step, forever
    for i in range(3 * n):
        ds.row_groups.fetch_bytes(i % n)
        pre.consumed(i)
    pre.close()
    assert ds.row_groups.range_fetcher().row_groups == n
    assert ds.storage.stats.requests - opened <= 2 * m.num_shards + 1


def test_prefetched_row_groups_reach_their_reader_from_memory(local_ds, tmp_path, monkeypatch):
    """The verified bytes of a range wait in memory for their reader: no disk-cache read
    (file, lock, second hash) for what the prefetcher fetched; none are left held after."""
    reads = []
    real = ChunkCache.get_or_fetch

    def counting(self, key, *a, **kw):
        reads.append(key)
        return real(self, key, *a, **kw)

    monkeypatch.setattr(ChunkCache, "get_or_fetch", counting)
    plain = open_dataset(local_ds)
    m = plain.manifest
    want = [plain.row_groups.fetch_bytes(rg) for rg in range(m.num_row_groups)]
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    steps = -(-m.num_row_groups // 2)
    reads.clear()
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
    got = _drain(ds, pre, steps)
    pre.close()
    assert got == want
    assert reads == []
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher._held_bytes == 0 and not fetcher._held
    # Every row group is in the disk cache all the same, for the next pass and other ranks.
    assert ds.cache.info()["entries"] == m.num_row_groups


def test_bytes_held_for_readers_are_bounded(local_ds, tmp_path):
    """Ranges nobody reads (yet) keep at most the held budget in memory, oldest dropped
    first; a dropped row group is then read from the disk cache, with no new request."""
    from concurrent.futures import ThreadPoolExecutor

    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    fetcher = ds.row_groups.range_fetcher()
    limit = 4 * int(m.rg_length.max())
    fetcher.hold(limit)
    fetcher.hold(limit // 2)            # the largest asked for wins
    rgs = list(range(m.num_row_groups))
    with ThreadPoolExecutor(1) as pool:
        [f.result() for f in fetcher.submit(fetcher.coalesce(rgs), pool)]
    assert 0 < fetcher._held_bytes <= limit
    assert fetcher._held_bytes == sum(len(b) for b in fetcher._held.values())
    assert list(fetcher._held) == sorted(fetcher._held)[-len(fetcher._held):]   # the newest
    plain = open_dataset(local_ds)
    requests = ds.storage.stats.requests
    for rg in (0, rgs[-1]):             # dropped long ago / still held
        assert ds.row_groups.fetch_bytes(rg) == plain.row_groups.fetch_bytes(rg)
    assert ds.storage.stats.requests == requests
    assert rgs[-1] not in fetcher._held


def test_each_step_s_row_groups_are_computed_once(local_ds, tmp_path):
    """The plan published every few steps covers many steps ahead: each step's row groups
    are computed once, not once per plan that covers it."""
    import collections

    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    calls: collections.Counter = collections.Counter()
    seq = sequential_steps(m, per_step=1)

    def step_rgs(i):
        calls[i] += 1
        return seq(i)

    pre = ds.row_groups.prefetcher(step_rgs, num_batches=m.num_row_groups, budget_bytes=1 << 30)
    for i in range(m.num_row_groups):
        ds.row_groups.fetch_bytes(int(seq(i)[0]))
        pre.consumed(i)
    pre.close()
    assert set(calls) == set(range(m.num_row_groups)) and max(calls.values()) == 1


def test_a_range_that_ran_out_of_retries_is_not_retried_again_alone(local_ds, tmp_path,
                                                                     monkeypatch):
    """Regression (issue 14): a coalesced range that failed after its retries made take()
    return None, and the reader fetched the row group alone with a fresh retry budget, so an
    outage surfaced after twice the deadline. One read, one budget."""
    from concurrent.futures import ThreadPoolExecutor

    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")),
                      retry=RetryPolicy(max_attempts=3, base_delay=0.0))
    m = ds.manifest
    fetcher = ds.row_groups.range_fetcher()
    pool = ThreadPoolExecutor(1)
    pool.shutdown()   # nobody runs the range ahead: the reader runs it in its own thread
    rgs = [int(r) for r in np.flatnonzero(m.rg_shard == 0)[:4]]
    fetcher.submit(fetcher.coalesce(rgs), pool)

    def down(*_args):
        raise ConnectionResetError("the store is down")

    monkeypatch.setattr("zephon_store.io.storage._pread", down)
    before = ds.storage.stats.requests
    with pytest.raises(RetriesExhaustedError) as e:
        ds.row_groups.fetch_bytes(rgs[1])
    assert e.value.attempts == 3 and ds.storage.stats.requests - before == 3
    assert m.shard_name(0) in str(e.value) and "3 attempts" in str(e.value)
