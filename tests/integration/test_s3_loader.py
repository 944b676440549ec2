"""End to end against a real S3 server: convert, verify, info/get, and stream the loader.

The loader streamed from S3 must yield exactly what a local copy yields (ids and bytes),
with every fault type injected while streaming; corrupt objects are reported, never
returned; a permanent outage fails within the deadline; a second epoch fetches nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import time

import numpy as np
import pytest
import s3fs

from tests.helpers import write_jsonl_corpus
from tests.helpers.faultproxy import (
    FaultProxy,
    cache_disk_full,
    cache_folder_vanishes,
    read_only_folder,
)
from zephon_store import IntegrityError, StorageError, convert, open_dataset
from zephon_store.cli.main import main
from zephon_store.io.cache import ChunkCache
from zephon_store.io.retry import RetryPolicy
from zephon_store.order import OrderOptions
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402

OPTS = WriteOptions(target_shard_bytes=40 << 10, row_group_bytes=6 << 10)
ORDER = OrderOptions(seed=5, window_blocks=2)
B = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3corpus")
    write_jsonl_corpus(d / "src", files=3, records=250, seed=9, suffix=".jsonl.zst")
    convert([str(d / "src")], str(d / "local"), options=OPTS)
    return d


@pytest.fixture()
def remote(corpus, s3_bucket):
    url = f"{s3_bucket.url}/ds"
    res = convert([str(corpus / "src")], url, options=OPTS, storage_options=s3_bucket.storage_options,
                  workers=2)
    return url, s3_bucket, res


def _stream(ds, steps, *, start_state=None, order=ORDER):
    loader = ZephonLoader(ds, global_batch=B, order=order, world_size=1, rank=0, with_seq=True,
                          max_steps=steps, prefetch=2)
    if start_state:
        loader.load_state_dict(start_state)
    ids, digest = [], hashlib.sha256()
    for batch in loader:
        ids.extend(batch["_seq"].tolist())
        for t in batch["text"]:
            digest.update(t.encode())
    return ids, digest.hexdigest(), loader.state_dict()


def _open(url, so, tmp_path, *, retry=None, name="cache"):
    return open_dataset(url, storage_options=so, cache=ChunkCache(str(tmp_path / name)),
                        retry=retry)


def test_convert_verify_info_get_on_s3(corpus, remote, capsys):
    url, bucket, res = remote
    local = open_dataset(str(corpus / "local"))
    assert res.dataset_id == local.dataset_id  # same bytes wherever they are stored
    so = json.dumps(bucket.storage_options)
    assert main(["verify", url, "--deep", "--storage-options", so]) == 0
    capsys.readouterr()
    assert main(["info", url, "--json", "--storage-options", so]) == 0
    assert json.loads(capsys.readouterr().out)["num_samples"] == local.num_samples
    assert main(["get", url, "3", "700", "--json", "--storage-options", so]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == local.take([3, 700]).to_pylist()
    # one PUT per shard and per side table, the manifest, and the rerun record
    # (.zephon-convert.json, formats/SPEC.md 1): nothing else in the bucket
    fs = s3fs.S3FileSystem(**bucket.storage_options, skip_instance_cache=True)
    names = sorted(p.split("/ds/")[1] for p in fs.find(f"{bucket.name}/ds"))
    assert "manifest.json" in names and ".zephon-convert.json" in names
    assert all(n in ("manifest.json", ".zephon-convert.json") or n.startswith(("shards/", "index/"))
               for n in names)


def test_stream_equals_local_and_second_epoch_fetches_nothing(corpus, remote, tmp_path):
    url, bucket, _ = remote
    n = open_dataset(str(corpus / "local")).num_samples
    steps = n // B
    local_ids, local_digest, _ = _stream(open_dataset(str(corpus / "local")), steps)
    ds = _open(url, bucket.storage_options, tmp_path)
    ids, digest, state = _stream(ds, steps)
    assert ids == local_ids and digest == local_digest
    first = ds.storage.stats.requests
    fetched = ds.storage.stats.bytes_fetched
    assert fetched >= ds.manifest.total_bytes * 0.9  # it really streamed the shards
    # epoch 2 (a fresh permutation) from the same node cache: no request at all
    ds2 = _open(url, bucket.storage_options, tmp_path)
    before = ds2.storage.stats.requests
    _stream(ds2, steps, start_state=state)
    assert ds2.storage.stats.requests == before
    assert first > 0


@pytest.mark.parametrize("fault", ["reset", "http503", "truncate", "blackhole", "latency",
                                   "down", "corrupt"])
def test_faults_while_streaming_do_not_change_the_output(corpus, remote, tmp_path, fault):
    url, bucket, _ = remote
    steps = 12
    want = _stream(open_dataset(str(corpus / "local")), steps)[:2]
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        so = bucket.options_via(proxy.endpoint_url, read_timeout=1.0, connect_timeout=1.0)
        ds = _open(url, so, tmp_path, retry=RetryPolicy(max_attempts=50, base_delay=0.05,
                                                        max_delay=0.5, deadline=30))
        # inject after the manifest is loaded, while row groups stream
        {"reset": lambda: proxy.reset_next(3), "http503": lambda: proxy.http503_next(3),
         "truncate": lambda: proxy.truncate_next(2, 200), "blackhole": lambda: proxy.blackhole_next(1),
         "latency": lambda: proxy.latency(0.05), "down": lambda: proxy.down(1.0),
         # issue 44: ten damaged shard responses in a row are ridden out like 503s
         "corrupt": lambda: proxy.corrupt_next(10, path=".parquet")}[fault]()
        got = _stream(ds, steps)[:2]
        assert got == want
        assert ds.row_groups.range_fetcher().ranges >= 1   # through coalesced ranges
        if fault not in ("latency", "down"):
            assert proxy.injected >= 1
        if fault != "latency":
            # aiohttp re-sends an idempotent request once after a reset by itself, so a
            # reset may be absorbed below our retry layer: then the proxy saw more requests.
            assert (ds.storage.stats.retries >= 1
                    or proxy.requests > ds.storage.stats.requests)


def test_loader_rides_out_an_outage_with_the_default_policy(corpus, remote, tmp_path):
    """Regression (issue 14): with the default RetryPolicy an S3 outage of 2 s stopped the
    loader (6 attempts in ~1.5 s). Now the default deadline is a minute."""
    url, bucket, _ = remote
    steps = 12
    want = _stream(open_dataset(str(corpus / "local")), steps)[:2]
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        so = bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0)
        ds = _open(url, so, tmp_path)           # retry=None: the default policy
        proxy.down(4.0)                         # every footer and row group read meets it
        assert _stream(ds, steps)[:2] == want
        assert ds.storage.stats.retries >= 3


def test_the_cli_sets_the_retry_deadline_through_storage_options(remote, capsys):
    """--storage-options '{"retry": {...}}' reaches the RetryPolicy; running out names the URL,
    the attempts and the seconds spent."""
    url, bucket, _ = remote
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        so = dict(bucket.options_via(proxy.endpoint_url, read_timeout=0.5, connect_timeout=0.5),
                  retry={"deadline": 0.5, "base_delay": 0.05, "max_delay": 0.1})
        proxy.down_forever()
        assert main(["info", url, "--json", "--storage-options", json.dumps(so)]) == 1
    err = capsys.readouterr().err
    # one attempt may take the whole budget on a loaded machine: "1 attempt" then
    assert re.search(rf"GET {re.escape(url)}/manifest\.json: gave up after \d+ attempts? in "
                     rf"[0-9.]+ s \(the 0\.5 s retry deadline ran out\)", err), err


def test_checksum_errors_on_manifest_and_side_tables_are_retried(corpus, remote, tmp_path):
    """Regression (issue 14): botocore's FlexibleChecksumError on a whole-object GET
    (manifest.json, a side table) was treated as permanent and killed open_dataset."""
    url, bucket, _ = remote
    want = _stream(open_dataset(str(corpus / "local")), 4)[:2]
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        proxy.bad_checksum_next(2, path="/manifest.json")
        proxy.corrupt_next(2, path="/index/")
        ds = _open(url, bucket.options_via(proxy.endpoint_url), tmp_path)
        assert proxy.injected == 4 and ds.storage.stats.integrity_failures == 4
        assert _stream(ds, 4)[:2] == want


# A stored corrupt object stays corrupt on every re-fetch: reported when the deadline ends.
SHORT = RetryPolicy(base_delay=0.05, max_delay=0.2, deadline=1.0)


def test_corrupt_object_is_reported_never_returned(corpus, remote, tmp_path):
    url, bucket, _ = remote
    ds = _open(url, bucket.storage_options, tmp_path, retry=SHORT)
    fs = s3fs.S3FileSystem(**bucket.storage_options, skip_instance_cache=True)
    m = ds.manifest
    rg = 0
    key = f"{bucket.name}/ds/{m.shard_path(int(m.rg_shard[rg]))}"
    data = bytearray(fs.cat_file(key))
    data[int(m.rg_offset[rg]) + 5] ^= 0x01
    fs.pipe_file(key, bytes(data))
    with pytest.raises(IntegrityError) as e:
        ds.take([0])
    assert m.shard_name(int(m.rg_shard[rg])) in str(e.value) and "row group 0" in str(e.value)
    assert e.value.url.endswith(".parquet")
    rep = verify(url, storage_options=bucket.storage_options)
    assert not rep.ok and {"row_group_hash", "hash_mismatch"} <= {f.kind for f in rep.findings}


def test_permanent_outage_fails_within_the_deadline(corpus, remote, tmp_path):
    url, bucket, _ = remote
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        so = bucket.options_via(proxy.endpoint_url, read_timeout=0.5, connect_timeout=0.5)
        policy = RetryPolicy(max_attempts=100, base_delay=0.05, max_delay=0.2, deadline=3.0)
        ds = _open(url, so, tmp_path, retry=policy)
        proxy.down_forever()
        t0 = time.monotonic()
        with pytest.raises(StorageError) as e:
            ds.take(np.arange(0, 40))
        elapsed = time.monotonic() - t0
        assert "attempt" in str(e.value) and url.split("/")[2] in str(e.value)
        assert elapsed < policy.deadline + 5  # the deadline bounds the failure


@pytest.mark.timeout(120)
def test_endless_remote_loader_over_a_small_dataset_keeps_yielding(remote, tmp_path):
    """Regression: the prefetcher once planned forever when the whole dataset fit its byte
    budget, so an endless remote loader never returned its first batch."""
    url, bucket, _ = remote
    ds = _open(url, bucket.storage_options, tmp_path)
    assert ds.manifest.total_bytes < 64 << 20  # smaller than the default prefetch budget
    loader = ZephonLoader(ds, global_batch=B, order=ORDER, world_size=1, rank=0, with_seq=True)
    it = iter(loader)
    n = ds.num_samples
    seen = [next(it)["_seq"] for _ in range(2 * n // B + 3)]  # more than two epochs
    ids = torch.cat(seen).tolist()
    assert sorted(ids[:n]) == list(range(n)) and sorted(ids[n:2 * n]) == list(range(n))


SEQ = OrderOptions(seed=5, shuffle=False)


def _stream_seq(ds, steps):
    return _stream(ds, steps, order=SEQ)[:2]


def _sequential_pass_through_proxy(corpus, remote, tmp_path, read):
    """``read(ds, steps)`` over the remote copy through a counting proxy: ``(ds, result,
    GETs made by the pass, the local copy's stream, row groups the pass reads)``."""
    url, bucket, _ = remote
    local = open_dataset(str(corpus / "local"))
    steps = local.num_samples // B
    want = _stream_seq(local, steps)
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        ds = _open(url, bucket.options_via(proxy.endpoint_url), tmp_path)
        opened = proxy.requests
        got = read(ds, steps)
        gets = proxy.requests - opened
    rgs_read = int(np.searchsorted(ds.manifest.rg_row_start, steps * B - 1, side="right"))
    return ds, got, gets, want, rgs_read


def test_sequential_pass_coalesces_row_groups_into_few_gets(corpus, remote, tmp_path):
    """Counted at the proxy (every HTTP request): a sequential pass reads each shard as one or
    two ranged GETs, not one per row group, and yields what the local copy yields."""
    ds, got, gets, want, read = _sequential_pass_through_proxy(corpus, remote, tmp_path,
                                                               _stream_seq)
    m = ds.manifest
    assert got == want
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher.row_groups == read and fetcher.refetched == 0   # all of them in ranges
    # footers (one per shard) + the first step's range + about one range per shard
    assert gets <= 2 * m.num_shards + 2
    assert m.num_row_groups >= 3 * m.num_shards and gets < m.num_row_groups / 1.5


def test_loader_coalesce_option_reaches_the_prefetcher(corpus, remote, tmp_path):
    """ZephonLoader(coalesce=CoalesceOptions(max_bytes=1)): one row group per GET, same stream."""
    from zephon_store.io.coalesce import CoalesceOptions

    def one_per_get(ds, steps):
        loader = ZephonLoader(ds, global_batch=B, order=SEQ, world_size=1, rank=0,
                              with_seq=True, max_steps=steps,
                              coalesce=CoalesceOptions(max_bytes=1))
        return [s for batch in loader for s in batch["_seq"].tolist()]

    ds, got, gets, want, read = _sequential_pass_through_proxy(corpus, remote, tmp_path,
                                                               one_per_get)
    assert got == want[0]
    assert gets >= read                    # no range merged two row groups
    with pytest.raises(TypeError, match="CoalesceOptions"):
        ZephonLoader(ds, global_batch=B, world_size=1, rank=0, coalesce={"max_bytes": 1})


def test_a_flipped_byte_in_a_coalesced_range_names_shard_and_row_group(corpus, remote, tmp_path):
    url, bucket, _ = remote
    ds = _open(url, bucket.storage_options, tmp_path, retry=SHORT)
    m = ds.manifest
    shard = int(m.rg_shard[0])
    rg = int(np.flatnonzero(m.rg_shard == shard)[2])   # inside the shard's first range
    fs = s3fs.S3FileSystem(**bucket.storage_options, skip_instance_cache=True)
    key = f"{bucket.name}/ds/{m.shard_path(shard)}"
    data = bytearray(fs.cat_file(key))
    data[int(m.rg_offset[rg]) + 11] ^= 0x01
    fs.pipe_file(key, bytes(data))
    with pytest.raises(IntegrityError) as e:
        _stream_seq(ds, ds.num_samples // B)
    msg = str(e.value)
    assert m.shard_name(shard) in msg and f"row group {m.rg_local_index(rg)}:" in msg
    assert e.value.url.endswith(".parquet") and e.value.expected == m.rg_xxh3(rg)
    fetcher = ds.row_groups.range_fetcher()
    assert fetcher.ranges >= 1 and fetcher.refetched >= 1   # found in a range, re-read alone
    assert not ds.cache.contains(m.rg_xxh3(rg))
    assert ds.cache.contains(m.rg_xxh3(rg - 1)) or ds.cache.contains(m.rg_xxh3(rg + 1))


def test_process_workers_stream_remote_data_in_ranges(corpus, remote, tmp_path):
    """num_workers=2: each worker prefetches its share in coalesced ranges; same stream."""
    url, bucket, _ = remote
    local = open_dataset(str(corpus / "local"))
    steps = local.num_samples // B
    want = _stream(local, steps)[:2]
    with FaultProxy(int(bucket.server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        ds = _open(url, bucket.options_via(proxy.endpoint_url), tmp_path)
        opened = proxy.requests
        loader = ZephonLoader(ds, global_batch=B, order=ORDER, world_size=1, rank=0,
                              with_seq=True, max_steps=steps, num_workers=2)
        ids, digest = [], hashlib.sha256()
        for batch in loader:
            ids.extend(batch["_seq"].tolist())
            for t in batch["text"]:
                digest.update(t.encode())
        gets = proxy.requests - opened
    assert (ids, digest.hexdigest()) == want
    # Two workers each read (most of) every shard's row groups in ranges: far fewer GETs
    # than row groups, even counted twice.
    assert gets < ds.manifest.num_row_groups


# -- a failing disk cache is bypassed, never fatal --------------------------------------------

@pytest.mark.parametrize("case", ["full", "read_only", "a_file", "deleted_mid_read"])
def test_a_failing_disk_cache_is_bypassed(corpus, remote, tmp_path, monkeypatch, caplog, case):
    """Regression (issue 14): a full filesystem, a read-only cache folder, a cache path that
    is a file, or the folder deleted mid-read made S3 reads fail. Now the cache is bypassed
    with one warning naming the folder and the error, and the data stays right."""
    url, bucket, _ = remote
    steps = 12
    local = open_dataset(str(corpus / "local"))
    want = _stream(local, steps)[:2]
    rows = [0, 5, local.num_samples - 1]
    cache_dir = tmp_path / "cache"
    stack = contextlib.ExitStack()
    if case == "full":
        cache_disk_full(monkeypatch)
    elif case == "read_only":
        # some entries already there (a hit must not try to write either), most missing
        _open(url, bucket.storage_options, tmp_path).take(rows[:1])
        stack.enter_context(read_only_folder(cache_dir))
    elif case == "a_file":
        cache_dir.write_bytes(b"not a folder")
    else:   # a cleanup job removes the folder while an entry is being written
        cache_folder_vanishes(monkeypatch, cache_dir)
    ds = _open(url, bucket.storage_options, tmp_path)
    with stack, caplog.at_level(logging.WARNING, logger="zephon_store.io.cache"):
        assert _stream(ds, steps)[:2] == want
        assert ds.take(rows).to_pylist() == local.take(rows).to_pylist()
        if case == "full":
            assert not any(".tmp-" in n for _, _, f in os.walk(cache_dir) for n in f)
    warned = [r.getMessage() for r in caplog.records if r.name == "zephon_store.io.cache"]
    assert len(warned) == 1 and ds.cache.stats.bypassed >= 1
    assert str(cache_dir) in warned[0] and "without caching" in warned[0]
    # A folder removed while other threads recreate it fails either way: the open finds no
    # folder, or makedirs sees EEXIST from a sibling thread and then no folder (seen in CI).
    assert any(text in warned[0] for text in {
        "full": ("No space left",), "a_file": ("Not a directory",),
        "read_only": ("Read-only file system" if os.geteuid() == 0 else "Permission denied",),
        "deleted_mid_read": ("No such file or directory", "File exists")}[case]), warned[0]
