"""Convert into S3 (SeaweedFS), GCS (fake-gcs-server) and Azure (Azurite) under kill -9 and
injected faults,
and the object stores' output lock."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, write_jsonl_corpus
from tests.helpers.faultproxy import FaultProxy
from zephon_store import convert
from zephon_store.cli.main import main
from zephon_store.errors import AccessDeniedError, OutputLockedError
from zephon_store.read.verify import verify
from zephon_store.write.shardwriter import WriteOptions

pytestmark = pytest.mark.integration

SIZES = ["--target-shard-size", "16KiB", "--row-group-size", "4KiB"]
# Fast retries for the faults below; the default budget (a minute) would only slow a failure.
FAST_RETRY = {"base_delay": 0.05, "max_delay": 0.2, "deadline": 30}


@pytest.fixture
def src(tmp_path):
    write_jsonl_corpus(tmp_path / "src", files=3, records=150, seed=7)
    return tmp_path / "src"


@pytest.fixture(params=["s3", "gcs", "az"])
def bucket(request):
    """A fresh bucket on each object store the tests start (SeaweedFS, fake-gcs-server,
    Azurite)."""
    return request.getfixturevalue(f"{request.param}_bucket")


def _port(bucket) -> int:
    server = bucket.server
    return server.ports["s3"] if hasattr(server, "ports") else server.port


def _objects(bucket, prefix: str) -> dict[str, str]:
    """{key below prefix: md5} of every object under ``<bucket url>/prefix``."""
    from zephon_store.io.storage import Storage

    st = Storage(f"{bucket.url}/{prefix}", storage_options=bucket.storage_options)
    fs = st.fs
    base = f"{bucket.name}/{prefix}"
    return {p[len(base) + 1:]: hashlib.md5(st.read_file(p[len(base) + 1:])).hexdigest()
            for p in fs.find(base)}


def _wait_for(condition, *, timeout: float = 60.0) -> None:
    """Poll ``condition`` (a proxy counter) until true: the proxy has no event to wait on."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


def _puts(proxy, part: str) -> int:
    """Uploads whose target names ``part`` (an S3 PUT, a GCS POST with the name quoted)."""
    from urllib.parse import unquote

    return sum(1 for method, target, _ in list(proxy.log)
               if method in ("PUT", "POST") and part in unquote(target))


def test_kill9_at_several_points_under_faults_then_rerun_is_identical(bucket, src, tmp_path):
    ref_url, url = f"{bucket.url}/ref", f"{bucket.url}/ds"
    assert main(["convert", str(src), "-o", ref_url, "--json", *SIZES, "--storage-options",
                 json.dumps(bucket.storage_options)]) == 0
    with FaultProxy(_port(bucket)) as proxy:
        opts = dict(bucket.options_via(proxy.endpoint_url, read_timeout=2), retry=FAST_RETRY)
        cmd = [sys.executable, "-m", "zephon_store.cli.main", "convert", str(src), "-o", url,
               "--json", *SIZES, "--storage-options", json.dumps(opts)]
        env = dict(os.environ, ZEPHON_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=ROOT)
        # Killed (SIGKILL) as the 2nd shard PUT, the 1st side-table PUT and the manifest PUT
        # reach the store, each run also meeting a 503 and a connection reset.
        for part, n in [("/shards/", 2), ("/index/", 1), ("/manifest.json", 1)]:
            proxy.reset_counters()
            proxy.http503_next(1)
            proxy.reset_next(1)
            p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
            try:
                _wait_for(lambda p=p, part=part, n=n: _puts(proxy, part) >= n or p.poll() is not None)
                assert p.poll() is None, p.stderr.read()
            finally:
                p.kill()
                p.wait()
        proxy.http503_next(2)
        proxy.reset_next(1)
        done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert proxy.injected >= 3
    assert _objects(bucket, "ds") == _objects(bucket, "ref")  # the lock is gone too
    report = verify(url, storage_options=bucket.storage_options, deep=True)
    assert report.ok and not report.findings, report.findings
    assert not os.listdir(tmp_path / "cache" / "staging")


def test_s3_lock_refuses_a_second_convert_and_takes_over_a_dead_one(bucket, src, tmp_path):
    from zephon_store.io.storage import Storage
    from zephon_store.write.lock import LOCK_NAME, output_lock

    url, so = f"{bucket.url}/ds", bucket.storage_options
    small = WriteOptions(target_shard_bytes=16 << 10, row_group_bytes=4 << 10)
    st = Storage(url, storage_options=so)
    with output_lock(st):
        with pytest.raises(OutputLockedError) as e:
            convert([str(src)], url, storage_options=so, options=small,
                    staging_dir=str(tmp_path / "staging"))
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in str(e.value)
    assert f"{url}/{LOCK_NAME}" in str(e.value) and not st.exists(LOCK_NAME)

    # A lock from another host is never guessed stale: it names what to remove.
    st.write_atomic(LOCK_NAME, json.dumps({"pid": 1, "host": "elsewhere", "since": "T",
                                           "token": "t"}).encode())
    with pytest.raises(OutputLockedError, match="pid 1 on host elsewhere.*remove"):
        convert([str(src)], url, storage_options=so, options=small)
    # One from a dead process on this host is taken over.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    st.write_atomic(LOCK_NAME, json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(),
                                           "since": "T", "token": "t"}).encode())
    convert([str(src)], url, storage_options=so, options=small)
    assert not st.exists(LOCK_NAME) and verify(url, storage_options=so).ok


_parsed: list[str] = []


def _recording_parse(f, options, storage_options, stats):
    from zephon_store.write.convert import _default_parse

    _parsed.append(f.url)
    yield from _default_parse(f, options, storage_options, stats)


def test_s3_output_with_bad_credentials_fails_before_any_input_is_parsed(s3_bucket, src):
    so = dict(s3_bucket.storage_options, secret="wrong", retry=FAST_RETRY)
    _parsed.clear()
    with pytest.raises(AccessDeniedError, match="credentials"):
        convert([str(src)], f"{s3_bucket.url}/ds", storage_options=so,
                parse_fn=_recording_parse)
    assert _parsed == []


def test_a_rerun_into_s3_with_nothing_to_do_writes_nothing(s3_bucket, src, tmp_path):
    """Issue 41 item 3 on an S3 output: the rerun reads the record, the manifest and one
    listing, and PUTs nothing but its lock; a shard gone from the bucket makes it convert."""
    with FaultProxy(s3_bucket.server.ports["s3"]) as proxy:
        options = s3_bucket.options_via(proxy.endpoint_url)
        url = f"{s3_bucket.url}/ds"
        opts = WriteOptions(target_shard_bytes=16 << 10, row_group_bytes=4 << 10)
        first = convert([str(src)], url, options=opts, storage_options=options)
        assert first.num_shards > 1
        before = _objects(s3_bucket, "ds")
        assert ".zephon-convert.json" in before
        proxy.log.clear()
        again = convert([str(src)], url, options=opts, storage_options=options)
        assert again.unchanged and again.dataset_id == first.dataset_id
        assert _puts(proxy, "/ds/") == _puts(proxy, ".zephon-lock")   # the lock only
        assert _objects(s3_bucket, "ds") == before
        shard = next(k for k in before if k.startswith("shards/"))
        proxy.log.clear()
        import s3fs
        s3fs.S3FileSystem(**s3_bucket.storage_options).rm_file(f"{s3_bucket.name}/ds/{shard}")
        third = convert([str(src)], url, options=opts, storage_options=options)
        assert not third.unchanged and third.shards_reused == first.num_shards - 1
        assert _objects(s3_bucket, "ds") == before
