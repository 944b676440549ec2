"""The start of a share: what a worker process inherits from its rank, and what the
prefetcher fetches before the share's first batch (issue 31, docs/benchmarks_start.md)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import converted, in_fork, sequential_steps, write_jsonl_corpus
from zephon_store import convert, open_dataset
from zephon_store.io import storage as storage_mod
from zephon_store.io import throttle as throttle_mod
from zephon_store.io.cache import ChunkCache
from zephon_store.io.throttle import NodeThrottle, background

# -- the S3 client stack, readied once before the workers fork ------------------------------


def _json_loads(monkeypatch) -> list[str]:
    import botocore.loaders

    seen: list[str] = []
    real = botocore.loaders.JSONFileLoader.load_file

    def counting(self, file_path):
        seen.append(str(file_path))
        return real(self, file_path)

    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file", counting)
    return seen


# The s3fs path (the storage option that asks for it), and options zephon's own GET client
# serves.
S3FS = {"s3_client": "s3fs"}
LEAN = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}


def _client(storage) -> None:
    """Build the storage's S3 client as its first request would (no request is sent)."""
    storage.fs.connect()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_worker_forked_after_prepare_reads_no_botocore_model_again(monkeypatch):
    pytest.importorskip("s3fs")
    so = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    storage_mod.prepare_s3_for_fork()
    seen = _json_loads(monkeypatch)

    def worker() -> int:   # the worker: a fresh Storage, as a DataLoader worker's copy makes
        _client(storage_mod.Storage("s3://bucket/ds", storage_options=so))
        return len(seen)

    loads = in_fork(worker)
    # The parent's botocore data is the child's: building the client parsed no JSON model
    # (without the shared loader each new session re-read ~10 files, ~0.2 s of CPU).
    assert loads == "0", loads


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_waits_for_the_preparation_started_in_a_thread(monkeypatch):
    pytest.importorskip("s3fs")
    monkeypatch.setattr(storage_mod, "_prepared", False)
    monkeypatch.setattr(storage_mod, "_prepare_thread", None)
    storage_mod.Storage("s3://bucket/ds", storage_options=S3FS).prepare_fork(soon=True)
    # Forked at once: the thread has barely started.
    seen = in_fork(lambda: storage_mod._prepared)
    assert seen == "True"   # the child got the finished preparation, never a half-done one
    assert storage_mod._prepared


def test_every_s3_session_of_a_process_shares_one_botocore_loader():
    pytest.importorskip("s3fs")
    so = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    a = storage_mod.Storage("s3://bucket/a", storage_options=so).fs
    b = storage_mod.Storage("s3://bucket/b", storage_options=so).fs
    assert a is not b
    assert a.session is not b.session   # each its own session (credentials, profile)
    assert (a.session.get_component("data_loader")
            is b.session.get_component("data_loader"))


def test_prepare_fork_is_for_s3_roots_only(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(storage_mod, "prepare_s3_for_fork", lambda: calls.append("s3fs"))
    monkeypatch.setattr(storage_mod, "prepare_lean_for_fork", lambda so: calls.append("lean"))
    storage_mod.Storage(str(tmp_path)).prepare_fork()
    storage_mod.Storage("memory://x/ds").prepare_fork()
    storage_mod.Storage("s3://bucket/ds", storage_options=S3FS).prepare_fork()
    storage_mod.Storage("s3://bucket/ds", storage_options=LEAN).prepare_fork()
    assert calls == ["s3fs", "lean"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_worker_forked_after_prepare_inherits_the_get_client():
    """Where zephon's own GET client serves the reads (io/s3_get.py), the rank makes it
    once and a forked worker uses that one (no credentials resolved again), with its own
    connections."""
    storage_mod.Storage("s3://bucket/ds", storage_options=LEAN).prepare_fork()
    parent = storage_mod.lean_client(LEAN)
    assert parent is not None
    same = in_fork(lambda: storage_mod.Storage("s3://bucket/ds", storage_options=LEAN)._lean()
                   is parent)
    assert same == "True"


def test_only_forked_workers_get_the_rank_s_client_stack(tmp_path, monkeypatch):
    from zephon_store.load.share_reader import ShareReader
    from zephon_store.order import OrderOptions
    from zephon_store.order.topology import Topology

    write_jsonl_corpus(tmp_path / "src", files=1, records=20, seed=1)
    convert([str(tmp_path / "src")], str(tmp_path / "ds"))
    reader = ShareReader(open_dataset(str(tmp_path / "ds")), OrderOptions(seed=1),
                         Topology(4, 1, 0))
    calls = []
    monkeypatch.setattr(storage_mod.Storage, "prepare_fork", lambda self: calls.append(self))
    reader.prepare_workers("spawn")
    reader.prepare_workers("forkserver")
    assert calls == []       # those workers import everything afresh
    reader.prepare_workers("fork")
    import multiprocessing

    reader.prepare_workers(multiprocessing.get_context("fork"))
    assert len(calls) == 2


# -- the prefetcher: the later steps wait for the first batch --------------------------------


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    return converted(tmp_path_factory.mktemp("prefetchstart"), files=2, records=400, seed=5,
                     target_shard_bytes=60 << 10, row_group_bytes=4 << 10)


def _settle(pre) -> None:
    for fut in list(pre._futures):
        if fut.running() or not fut.done():
            try:
                fut.result(timeout=30)
            except Exception:  # noqa: BLE001 - a held one is not running: skipped below
                pass


def test_only_the_first_step_is_fetched_before_the_first_batch(local_ds, tmp_path):
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    steps = -(-m.num_row_groups // 2)
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=steps)
    fetcher = ds.row_groups.range_fetcher()
    try:
        started = [f for f in pre._futures if f.running() or f.done()]
        for fut in started:
            fut.result(timeout=30)
        # Step 0's two row groups, one range; the rest of the budget is queued but held.
        assert fetcher.row_groups == 2 and fetcher.ranges == 1
        assert ds.cache.info()["entries"] == 2
        assert len(pre._futures) > 1 and not any(f.done() for f in pre._futures[1:])
        pre.consumed(0)   # the first batch is handed out: the held ranges run
        for fut in pre._futures:
            fut.result(timeout=30)
        assert fetcher.row_groups > 2
    finally:
        pre.close()


def test_a_reader_needing_a_held_row_group_runs_its_range_itself(local_ds, tmp_path):
    ds = open_dataset(local_ds, cache=ChunkCache(str(tmp_path / "c")))
    m = ds.manifest
    want = open_dataset(local_ds).row_groups.fetch_bytes(3)
    pre = ds.row_groups.prefetcher(sequential_steps(m), num_batches=-(-m.num_row_groups // 2))
    try:
        opened = ds.storage.stats.requests
        got = ds.row_groups.fetch_bytes(3)   # step 1's, before the first batch
        assert got == want
        fetcher = ds.row_groups.range_fetcher()
        # One coalesced GET ran in this thread (no row group fetched alone, none twice).
        assert fetcher.ranges >= 2 and ds.storage.stats.requests - opened <= 2
    finally:
        pre.close()


def test_a_row_group_published_before_the_claim_is_not_fetched_again(local_ds, tmp_path):
    """Another process fetched and published a row group between a range's cache check and
    its claim: the range must not GET those bytes a second time."""
    cache = ChunkCache(str(tmp_path / "c"))
    ds = open_dataset(local_ds, cache=cache)
    m = ds.manifest
    rg = 0
    cache.put(m.rg_xxh3(rg), open_dataset(local_ds).row_groups.fetch_bytes(rg))
    real, stale = cache.contains, [True]

    def contains(key):   # the first check is from before the other process published
        if stale and key == m.rg_xxh3(rg):
            stale.clear()
            return False
        return real(key)

    cache.contains = contains
    fetcher = ds.row_groups.range_fetcher()
    opened = ds.storage.stats.requests
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        [f.result() for f in fetcher.submit(fetcher.coalesce([rg]), pool)]
    assert ds.storage.stats.requests == opened and fetcher.ranges == 0


# -- background requests yield to the others while the node is paced ------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_background_requests_yield_and_others_take_the_next_slot(tmp_path):
    clock = _Clock()
    t = NodeThrottle(tmp_path, clock=clock, sleep=clock.sleep)
    with background():
        assert t.wait() == 0.0           # not paced: a background request goes at once too
    t.report()                           # paced from the end of the gather on
    assert t.wait() == pytest.approx(0.25)
    interval = t.state().next_slot - clock.now
    assert interval > 0
    with background():
        # A slot is reserved ahead of now (the next foreground one's): the background
        # request lets it pass (one interval), and takes a slot once the schedule is idle
        # (one interval later): a foreground request would have waited one.
        assert t.wait() == pytest.approx(2 * interval, abs=1e-5)
    # A foreground request asking now takes the next slot, not yielding: one interval.
    clock.now += 0.01
    reserved = t.state().next_slot - clock.now
    assert reserved > 0 and t.wait() == pytest.approx(reserved, abs=1e-5)


def test_a_background_wait_is_bounded(tmp_path, monkeypatch):
    """Past MAX_BACKGROUND_WAIT a background request takes a slot like the others (the
    schedule simulated for many foreground readers: tests/unit/io/test_throttle_rate.py)."""
    clock = _Clock()
    t = NodeThrottle(tmp_path, clock=clock, sleep=clock.sleep)
    monkeypatch.setattr(throttle_mod, "MAX_BACKGROUND_WAIT", 3.0)
    t.report()
    clock.now += 0.3
    st = t.state()
    far = throttle_mod.RateState(st.wmax, st.t_dec, clock.now + 100.0, 0.0)
    with open(t.path, "r+b") as f:       # a foreground queue reserved for 100 s
        f.write(far.encode())
    with background():
        # It yields 3 s, then takes the slot after the queue.
        assert t.wait() == pytest.approx(100.0, abs=1e-5)
