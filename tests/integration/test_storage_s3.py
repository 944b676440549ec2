"""Storage against a real S3 server (SeaweedFS) and through a fault-injecting proxy.

Assertions count requests and bytes (ours in ``Storage.stats``, the wire's in the proxy); the
only timing bound is on how fast a permanent outage fails.
"""

from __future__ import annotations

import os
import pickle
import sys
import time

import pytest

from tests.helpers.faultproxy import FaultProxy
from zephon_store._util.hashing import xxh3_hex
from zephon_store.errors import (
    IntegrityError,
    MissingExtraError,
    RetriesExhaustedError,
    ShardNotFoundError,
    StorageError,
    StorageOptionsError,
    UnsafePathError,
)
from zephon_store.io.retry import RetryPolicy
from zephon_store.io.storage import AccessDeniedError, Storage, StorageStats

pytestmark = pytest.mark.integration

DATA = os.urandom(3 << 20)
START, END = 1000, 1000 + (1 << 20)
PIECE = DATA[START:END]
PIECE_XXH3 = xxh3_hex(PIECE)
# Fast, deterministic retries: no jitter, small delays, generous attempts.
FAST = RetryPolicy(max_attempts=6, base_delay=0.05, max_delay=0.2, deadline=20.0, jitter=False)


@pytest.fixture
def dataset(s3_bucket) -> str:
    """``s3://<bucket>/ds`` holding ``shards/obj.bin`` = DATA (written directly, no proxy)."""
    url = f"{s3_bucket.url}/ds"
    Storage(url, storage_options=s3_bucket.storage_options).write_atomic("shards/obj.bin", DATA)
    return url


@pytest.fixture
def proxy(s3_bucket):
    with FaultProxy(s3_bucket.server.ports["s3"]) as p:
        yield p


def via_proxy(dataset, s3_bucket, proxy, *, retry=FAST, read_timeout=5.0) -> Storage:
    opts = s3_bucket.options_via(proxy.endpoint_url, read_timeout=read_timeout)
    return Storage(dataset, storage_options=opts, retry=retry)


def warmed(st: Storage, proxy) -> Storage:
    """``st`` with its S3 client built by one request, then every counter at zero.

    An outage test starts its outage after this: building a botocore client takes about a
    second, and on a loaded host longer than a short outage, which would then end before
    the first request and leave nothing to retry.
    """
    st.size("shards/obj.bin")
    st.stats = StorageStats()
    proxy.reset_counters()
    return st


@pytest.fixture(params=["local", "s3"])
def any_root(request, tmp_path):
    if request.param == "local":
        return Storage(str(tmp_path / "ds"))
    bucket = request.getfixturevalue("s3_bucket")
    return Storage(f"{bucket.url}/ds", storage_options=bucket.storage_options, retry=FAST)


def test_round_trip(any_root, tmp_path):
    st = any_root
    st.write_atomic("shards/a.bin", DATA)
    assert st.exists("shards/a.bin") and not st.exists("shards/nope.bin")
    assert st.size("shards/a.bin") == len(DATA)
    assert st.read_range("shards/a.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert st.read_file("shards/a.bin", expected_xxh3=xxh3_hex(DATA)) == DATA
    assert st.read_range("shards/a.bin", 5, 5) == b""
    with pytest.raises(ShardNotFoundError, match="not found at"):
        st.read_range("shards/none.bin", 0, 10)
    with pytest.raises(StorageError, match="short read"):
        st.read_range("shards/a.bin", len(DATA) - 10, len(DATA) + 10)

    local = tmp_path / "upload.bin"
    local.write_bytes(b"manifest bytes")
    st.write_file_from_local("manifest.json", str(local))
    assert st.read_file("manifest.json") == b"manifest bytes" and local.exists()
    st.write_file_from_local("shards/b.bin", str(local), move=True)
    assert not local.exists() and st.read_file("shards/b.bin") == b"manifest bytes"

    assert st.listdir("shards") == ["shards/a.bin", "shards/b.bin"]
    assert st.listdir("missing") == []
    st.delete("shards/b.bin")
    st.delete("shards/b.bin")  # missing is fine
    assert st.listdir("shards") == ["shards/a.bin"]
    # The short read: once locally (a disk's bytes are the stored ones), and on S3 again
    # after each back-off until the policy runs out (FAST: 6 attempts).
    assert (st.stats.integrity_failures, st.stats.retries) == ((1, 0) if st.local else (6, 5))

    copy = pickle.loads(pickle.dumps(st))  # e.g. a DataLoader worker
    assert copy.read_range("shards/a.bin", 0, 10) == DATA[:10]


def test_local_writes_leave_no_temp_files(tmp_path):
    st = Storage(str(tmp_path))
    st.write_atomic("shards/x.bin", b"one")
    st.write_atomic("shards/x.bin", b"two")
    assert os.listdir(tmp_path / "shards") == ["x.bin"]
    assert st.read_file("shards/x.bin") == b"two"


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_published_files_get_the_mode_of_a_normal_file(tmp_path, umask):
    """Regression (issue 14): the atomic write's mkstemp left manifest.json and side tables
    at 0600, so another user could not read a shared dataset; a staged file published by
    rename kept whatever mode it was staged with."""
    import stat
    import tempfile

    def staged(data: bytes) -> str:
        fd, path = tempfile.mkstemp(dir=tmp_path)   # 0600, like any mkstemp'd staging file
        os.write(fd, data)
        os.close(fd)
        return path

    old = os.umask(umask)
    try:
        st = Storage(str(tmp_path / "ds"))
        st.write_atomic("manifest.json", b"{}")
        st.write_atomic("manifest.json", b"{ }")                       # over an existing one
        st.write_file_from_local("shards/a.parquet", staged(b"a"), move=True)   # rename
        st.write_file_from_local("index/b.arrow", staged(b"b"))                 # copy
    finally:
        os.umask(old)
    for rel in ("manifest.json", "shards/a.parquet", "index/b.arrow"):
        mode = stat.S_IMODE(os.stat(tmp_path / "ds" / rel).st_mode)
        assert mode == 0o666 & ~umask, (rel, oct(mode))


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "s3://other/x", "a/../../b", "a//b", ""])
def test_paths_outside_the_root_are_rejected(tmp_path, bad):
    st = Storage(str(tmp_path))
    with pytest.raises(UnsafePathError, match="unsafe path"):
        st.read_file(bad)


def test_s3_urls_without_s3fs_name_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "s3fs", None)  # import s3fs -> ImportError
    st = Storage("s3://bucket/ds")  # constructing needs nothing
    with pytest.raises(MissingExtraError, match=r"zephon_store\[s3\]"):
        st.read_file("manifest.json")


def test_s3_without_proxy_counts_one_request_per_range(dataset, s3_bucket):
    st = Storage(dataset, storage_options=s3_bucket.storage_options)
    for i in range(5):
        lo = i * 1000
        assert st.read_range("shards/obj.bin", lo, lo + 100) == DATA[lo:lo + 100]
    assert st.stats.requests == 5 and st.stats.bytes_fetched == 500


def test_aws_environment_variables_are_honoured(dataset, s3_bucket, monkeypatch):
    opts = s3_bucket.storage_options
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", opts["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", opts["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", opts["endpoint_url"])
    st = Storage(dataset)
    assert st.read_range("shards/obj.bin", 0, 64) == DATA[:64]


# -- faults ---------------------------------------------------------------------------------

def test_clean_read_through_the_proxy(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert (proxy.requests, proxy.injected, proxy.bytes_down) == (1, 0, len(PIECE))
    assert st.stats.as_dict() == {"requests": 1, "bytes_fetched": len(PIECE), "retries": 0,
                                  "integrity_failures": 0}


def test_connection_resets_are_retried(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    proxy.reset_next(2)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    # aiohttp itself retries an idempotent request once after a reset, so both resets can
    # land in one of our attempts; on the wire: two resets, then one good GET.
    assert (proxy.requests, proxy.injected, proxy.bytes_down) == (3, 2, len(PIECE))
    assert st.stats.retries >= 1


def test_503_slowdown_is_retried(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    proxy.http503_next(2)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert (proxy.requests, proxy.injected) == (3, 2)
    assert (st.stats.requests, st.stats.retries) == (3, 2)


def test_truncated_bodies_are_retried(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    proxy.truncate_next(2, nbytes=4096)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert (proxy.requests, proxy.injected) == (3, 2)
    assert proxy.bytes_down == 2 * 4096 + len(PIECE)
    assert (st.stats.requests, st.stats.retries, st.stats.bytes_fetched) == (3, 2, len(PIECE))


def test_blackholed_request_times_out_and_is_retried(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy, read_timeout=0.5)
    proxy.blackhole_next(1)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert (proxy.requests, proxy.injected) == (2, 1)
    assert (st.stats.requests, st.stats.retries) == (2, 1)


def test_latency_below_the_timeout_needs_no_retry(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy, read_timeout=2.0)
    proxy.latency(0.2)
    for _ in range(2):
        assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert (proxy.requests, st.stats.requests, st.stats.retries) == (2, 2, 0)


def test_short_outage_is_ridden_out(dataset, s3_bucket, proxy):
    # Sleeps 0.25, 0.5, 0.5, ... so attempts keep coming for longer than the 1.5 s outage.
    retry = RetryPolicy(max_attempts=10, base_delay=0.25, max_delay=0.5, deadline=20.0,
                        jitter=False)
    st = warmed(via_proxy(dataset, s3_bucket, proxy, retry=retry), proxy)
    proxy.down(1.5)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert st.stats.retries >= 2  # refused connections never reach the proxy's counters
    assert (proxy.requests, proxy.bytes_down) == (1, len(PIECE))


def test_an_outage_of_seconds_is_ridden_out_by_the_default_policy(dataset, s3_bucket, proxy):
    """Regression (issue 14): the old default gave up in ~1.5 s (6 attempts from 0.1 s)."""
    opts = s3_bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0)
    st = warmed(Storage(dataset, storage_options=opts), proxy)  # RetryPolicy(): 60 s deadline
    proxy.down(4.0)
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    assert st.read_file("shards/obj.bin") == DATA
    assert st.stats.retries >= 3 and (proxy.requests, proxy.injected) == (2, 0)


def test_a_short_deadline_names_url_attempts_and_elapsed_time(dataset, s3_bucket, proxy):
    # the "retry" storage option: how the CLI's --storage-options and ZephonLoader set it
    # A 2 s deadline over 0.5 s timeouts: room for a second attempt even when the first one
    # (client start included) runs slow on a loaded host (1 s once left room for one only).
    opts = dict(s3_bucket.options_via(proxy.endpoint_url, read_timeout=0.5, connect_timeout=0.5),
                retry={"deadline": 2.0, "base_delay": 0.05, "max_delay": 0.2})
    st = Storage(dataset, storage_options=opts)
    assert st.retry == RetryPolicy(deadline=2.0, base_delay=0.05, max_delay=0.2)
    proxy.down_forever()
    with pytest.raises(RetriesExhaustedError) as info:
        st.read_file("shards/obj.bin")
    err = info.value
    url = f"{dataset}/shards/obj.bin"
    assert err.url == url and err.attempts == st.stats.requests >= 2 and err.elapsed >= 2.0
    msg = str(err)
    assert url in msg and f"{err.attempts} attempts in {err.elapsed:.1f} s" in msg
    assert "2 s retry deadline" in msg and '"retry": {"deadline"' in msg


def test_a_long_retry_logs_one_warning(tmp_path, monkeypatch, caplog):
    """Retrying quietly for a minute would look like a hang: one warning per operation."""
    import logging

    st = Storage(str(tmp_path), retry=RetryPolicy(max_attempts=4, base_delay=0.0))
    st.write_atomic("shards/a.bin", b"0123456789")
    monkeypatch.setattr("zephon_store.io.storage._WARN_RETRYING_AFTER_S", 0.0)
    calls = []

    def flaky(path, start, end):
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionResetError("peer reset")
        return b"23"

    monkeypatch.setattr("zephon_store.io.storage._pread", flaky)
    with caplog.at_level(logging.WARNING, logger="zephon_store.io.storage"):
        assert st.read_range("shards/a.bin", 2, 4) == b"23"
    warned = [r.getMessage() for r in caplog.records if r.name == "zephon_store.io.storage"]
    assert len(warned) == 1 and st.stats.retries == 3
    assert "still retrying" in warned[0] and f"{tmp_path}/shards/a.bin" in warned[0]


def test_unknown_storage_options_are_named_before_any_request(s3_bucket):
    for bad, named in [({"endpont_url": "http://x"}, "did you mean 'endpoint_url'"),
                       ({"retries": 3}, "'retries'"),
                       ({"region_name": "eu-west-1"}, "put it in client_kwargs"),
                       ({"config_kwargs": {"read_timout": 1}}, "read_timout"),
                       ({"client_kwargs": "x"}, "must be an object"),
                       ({"retry": {"deadlin": 5}}, "unknown retry option 'deadlin'")]:
        st = None
        with pytest.raises(StorageOptionsError, match=named) as info:
            st = Storage(f"{s3_bucket.url}/ds", storage_options={**s3_bucket.storage_options,
                                                                 **bad})
            st.read_file("manifest.json")
        assert isinstance(info.value, ValueError)
        if "unknown storage option" in str(info.value):
            assert "endpoint_url" in str(info.value) and "profile" in str(info.value)
        assert st is None or st.stats.requests == 0


def test_permanent_outage_fails_with_a_clear_error(dataset, s3_bucket, proxy):
    retry = RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=0.1, deadline=5.0)
    st = via_proxy(dataset, s3_bucket, proxy, retry=retry)
    proxy.down_forever()
    t0 = time.monotonic()
    with pytest.raises(StorageError) as info:
        st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3, what="row group 7")
    assert time.monotonic() - t0 < retry.deadline + 5.0  # a bound on failing, not a benchmark
    err = info.value
    assert err.attempts == 4 and st.stats.requests == 4 and st.stats.retries == 3
    assert f"{dataset}/shards/obj.bin" in str(err) and "4 attempts" in str(err)
    assert proxy.connections == 0


def test_corrupt_object_raises_integrity_error_after_refetching(dataset, s3_bucket, proxy):
    flipped = bytearray(DATA)
    flipped[START + 10] ^= 0xFF
    Storage(dataset, storage_options=s3_bucket.storage_options).write_atomic(
        "shards/obj.bin", bytes(flipped))
    st = via_proxy(dataset, s3_bucket, proxy)
    with pytest.raises(IntegrityError) as info:
        st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3,
                      what="shard obj row group 0")
    err = info.value
    url = f"{dataset}/shards/obj.bin"
    assert err.url == url and err.expected == PIECE_XXH3
    assert err.actual == xxh3_hex(bytes(flipped[START:END]))
    msg = str(err)
    assert url in msg and "shard obj row group 0" in msg and "zephon verify" in msg
    assert PIECE_XXH3 in msg and err.actual in msg
    assert "6 reads over" in msg   # FAST allows 6 attempts, each after a back-off
    assert st.stats.integrity_failures == 6 and st.stats.requests == 6
    assert proxy.requests == 6 and st.stats.retries == 5


def test_ten_corrupted_responses_in_a_row_are_ridden_out_like_a_5xx(dataset, s3_bucket, proxy):
    """Issue 44: a range that fails its hash is fetched again after a back-off, within the
    read's deadline, like a 503; ten damaged responses in a row once raised IntegrityError
    after three reads in 0.2 s."""
    policy = RetryPolicy(base_delay=0.02, max_delay=0.1, deadline=20.0, jitter=False)
    st = warmed(via_proxy(dataset, s3_bucket, proxy, retry=policy), proxy)
    proxy.corrupt_next(10)
    t0 = time.monotonic()
    assert st.read_range("shards/obj.bin", START, END, expected_xxh3=PIECE_XXH3) == PIECE
    elapsed = time.monotonic() - t0
    assert (proxy.requests, proxy.injected) == (11, 10)
    assert st.stats.integrity_failures == 10 and st.stats.retries == 10
    # The back-offs were slept: 0.02 + 0.04 + 0.08 + 7 x 0.1 s without jitter.
    assert elapsed >= sum(policy.backoff(k) for k in range(1, 11)) - 0.01


def test_missing_object_fails_fast(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    with pytest.raises(ShardNotFoundError) as info:
        st.read_range("shards/missing.bin", 0, 100, what="shard missing")
    assert isinstance(info.value, FileNotFoundError)
    assert f"{dataset}/shards/missing.bin" in str(info.value)
    assert (st.stats.requests, st.stats.retries, proxy.requests) == (1, 0, 1)
    with pytest.raises(ShardNotFoundError):
        st.size("shards/missing.bin")


def test_wrong_secret_is_denied_without_retries(dataset, s3_bucket, proxy):
    opts = dict(s3_bucket.options_via(proxy.endpoint_url), secret="not-the-secret")
    st = Storage(dataset, storage_options=opts, retry=FAST)
    with pytest.raises(AccessDeniedError) as info:
        st.read_range("shards/obj.bin", 0, 100)
    assert isinstance(info.value, PermissionError) and isinstance(info.value, StorageError)
    assert "check credentials" in str(info.value)
    assert (st.stats.requests, st.stats.retries, proxy.requests) == (1, 0, 1)


@pytest.mark.parametrize("fault", ["corrupt_next", "bad_checksum_next"])
def test_checksum_error_on_a_whole_object_get_is_refetched(dataset, s3_bucket, proxy, fault):
    """botocore's FlexibleChecksumError (the S3 checksum header does not match the body of a
    whole-object GET, e.g. manifest.json) heals on a re-fetch like an xxh3 mismatch."""
    st = via_proxy(dataset, s3_bucket, proxy)
    getattr(proxy, fault)(2)
    assert st.read_file("shards/obj.bin") == DATA
    assert st.read_file("shards/obj.bin", expected_xxh3=xxh3_hex(DATA)) == DATA
    assert (proxy.requests, proxy.injected) == (4, 2)
    assert st.stats.integrity_failures == 2


def test_a_checksum_error_on_every_get_raises_integrity_error(dataset, s3_bucket, proxy):
    st = via_proxy(dataset, s3_bucket, proxy)
    proxy.bad_checksum_next(6)
    with pytest.raises(IntegrityError) as info:
        st.read_file("shards/obj.bin", what="manifest")
    msg = str(info.value)
    assert f"{dataset}/shards/obj.bin" in msg and "checksum" in msg and "6 reads" in msg
    assert "zephon verify" in msg and info.value.url == f"{dataset}/shards/obj.bin"
    assert (proxy.requests, st.stats.integrity_failures) == (6, 6)
