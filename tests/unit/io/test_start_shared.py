"""The start's node-shared pieces, without a server: the shared request rate's file
(io/throttle.py; its math: test_throttle_rate.py), the node's recent copy of a mutable object (ChunkCache.get_or_fetch_recent)
and the manifest loaded once per node through them (format/manifest.py)."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from zephon_store import convert
from zephon_store.errors import RetriesExhaustedError
from zephon_store.format.manifest import MANIFEST_NAME, load_manifest
from zephon_store.io.cache import ChunkCache
from zephon_store.io.retry import RetryPolicy, is_throttle, is_transient
from zephon_store.io.storage import Storage
from zephon_store.io.throttle import NodeThrottle, RateState
from zephon_store.testing.synthetic import RG_BYTES, write_synthetic
from zephon_store.write.shardwriter import WriteOptions


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def _throttle(tmp_path, clock, **kw) -> NodeThrottle:
    return NodeThrottle(tmp_path, clock=clock, sleep=clock.sleep, **kw)


class _SlowDown(Exception):
    """What botocore raises for S3's 503 SlowDown (the fields is_throttle reads)."""

    def __init__(self, code="SlowDown", status=503) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


def test_throttle_is_a_transient_error_and_only_throttles_count():
    for exc in (_SlowDown(), _SlowDown("TooManyRequests", 429), _SlowDown("Throttling", 400)):
        assert is_throttle(exc) and is_transient(exc)
    for exc in (ConnectionResetError(), _SlowDown("InternalError", 500), FileNotFoundError()):
        assert not is_throttle(exc)


def test_processes_of_a_node_share_one_rate(tmp_path):
    clock = _Clock()
    a, b = _throttle(tmp_path, clock), _throttle(tmp_path, clock)   # two processes' handles
    assert b.wait() == 0.0 and a.wait() == 0.0 and clock.slept == []
    a.report()                                  # a is throttled: b is paced too
    st = b.state()
    assert st.t_dec == pytest.approx(1000.25) and st.wmax == pytest.approx(1.0)
    # b waits out the gather (adding its own rate), then takes the first slot; the next
    # request, a's, waits one interval of the node's rate.
    assert b.wait() == pytest.approx(0.25)
    assert b.state().wmax == pytest.approx(3.0)  # b's request sent and the one it asks for
    assert a.wait() == pytest.approx(1 / (0.7 * 3.0), abs=1e-5)   # the file keeps µs
    # A throttle of the request b let go before a's report changes nothing more ...
    a.report(sent_at=999.0)
    assert a.decreases == 1
    # ... one of a request let go after it decreases the rate again.
    b.report()
    assert b.decreases == 1 and b.state().t_dec == clock.now
    clock.now += 100                            # long after: the pacing has ended
    assert a.rate() is None and a.wait() == 0.0


def test_an_unusable_folder_leaves_each_process_alone(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    t = NodeThrottle(blocker)                   # its folder is a file: no shared state
    t.report()
    assert t.state() == RateState() and t.wait() == 0.0 and t.rate() is None


def test_storage_waits_on_and_reports_to_the_node_throttle(tmp_path, monkeypatch):
    clock = _Clock()
    throttle = _throttle(tmp_path / "node", clock)
    st = Storage("s3://bucket/ds", throttle=throttle,
                 retry=RetryPolicy(base_delay=0.0, max_delay=0.0, deadline=3600))
    st.local = False
    calls = []

    def flaky():
        calls.append(clock.now)
        if len(calls) < 3:
            raise OSError("failed") from _SlowDown()
        return b"ok"

    monkeypatch.setattr("time.sleep", lambda s: None)   # the retry's own (zero) delays
    assert st._call(flaky, url="s3://bucket/ds/x", label="x", op="GET") == b"ok"
    assert throttle.reports == 2 and throttle.decreases == 2
    # The second attempt waited for the node's rate to be gathered (0.25 s), the third for
    # a slot of the decreased rate (the floor, 0.5/s: 2 s): the node slowed down, not only
    # the attempt's own retry delay.
    assert calls[1] - calls[0] == pytest.approx(0.25)
    assert calls[2] - calls[1] == pytest.approx(2.0)
    st2 = Storage("s3://bucket/ds", throttle=throttle,
                  retry=RetryPolicy(base_delay=0.0, max_delay=0.0, max_attempts=2))
    st2.local = False

    def refused():
        raise OSError("refused") from _SlowDown()

    with pytest.raises(RetriesExhaustedError):   # the policy bounds a throttled request
        st2._call(refused, url="s3://bucket/ds/x", label="x", op="GET")
    assert throttle.reports == 3   # the last refusal raises; there is no next request


def test_recent_copy_is_fetched_once_per_node_and_expires(tmp_path):
    cache = ChunkCache(tmp_path)
    fetches = []
    barrier = threading.Barrier(6)

    def fetch():
        fetches.append(1)
        return b"manifest v1"

    def one(out):
        barrier.wait()
        out.append(ChunkCache(tmp_path).get_or_fetch_recent("s3://b/ds/manifest.json", fetch))

    outs: list = []
    threads = [threading.Thread(target=one, args=(outs,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(fetches) == 1 and sorted(outs)[0] == (b"manifest v1", False)
    assert sum(shared for _, shared in outs) == 5
    # Past max_age the next process fetches again (and sees a replaced object).
    assert cache.get_or_fetch_recent("s3://b/ds/manifest.json", lambda: b"v2",
                                     max_age=0.0) == (b"v2", False)
    # Another name is another object; drop_recent forgets a copy.
    assert cache.get_or_fetch_recent("s3://b/other/manifest.json", lambda: b"o") == (b"o", False)
    cache.drop_recent("s3://b/ds/manifest.json")
    assert cache.get_or_fetch_recent("s3://b/ds/manifest.json", lambda: b"v3") == (b"v3", False)
    cache.clear()                               # zephon cache clear forgets them too
    assert cache.get_or_fetch_recent("s3://b/ds/manifest.json", lambda: b"v4") == (b"v4", False)


class _CountingStorage(Storage):
    """A local dataset read as if it were remote, every whole-object read counted."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.local = False
        self.reads: list[str] = []

    def _path(self, relpath: str, *, allow_empty: bool = False) -> str:
        return os.path.join(self.root_url, relpath)

    def read_file(self, relpath, *, expected_xxh3=None, what=""):
        self.reads.append(relpath)
        with open(self._path(relpath), "rb") as f:
            data = f.read()
        from zephon_store._util.hashing import xxh3_hex
        if expected_xxh3 is not None:
            assert xxh3_hex(data) == expected_xxh3
        return data


@pytest.fixture()
def dataset(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"id": i, "text": "x" * i}) + "\n" for i in range(200)))
    out = tmp_path / "ds"
    convert([str(src)], str(out), options=WriteOptions(row_group_rows=10,
                                                        target_shard_bytes="4KiB"))
    return str(out)


def test_manifest_and_side_tables_fetched_once_per_node(dataset, tmp_path):
    cache = ChunkCache(tmp_path / "node")
    first = _CountingStorage(dataset)
    m1 = load_manifest(first, node_cache=cache)
    # The manifest, then the shard and row-group tables (provenance only when asked for).
    assert first.reads[0] == MANIFEST_NAME and len(first.reads) == 3
    assert set(first.reads[1:]) < set(m1.table_sizes())
    others = [_CountingStorage(dataset) for _ in range(3)]
    for st in others:
        m = load_manifest(st, node_cache=ChunkCache(tmp_path / "node"))
        assert m.dataset_id == m1.dataset_id and (m.rg_rows == m1.rg_rows).all()
    assert [st.reads for st in others] == [[], [], []]
    # Without the node cache every process reads all three itself.
    alone = _CountingStorage(dataset)
    load_manifest(alone)
    assert len(alone.reads) == 3


def test_the_manifest_s_fetcher_fetches_the_side_tables_before_the_others_go_on(dataset,
                                                                                  tmp_path):
    """The process that fetches the manifest has the node's side tables cached before any
    other process stops waiting for it, so no process that read the manifest from the node's
    copy (and has no S3 client yet) holds a side table's lock while the node waits."""
    from zephon_store.format.manifest import _read_manifest_doc

    cache = ChunkCache(tmp_path / "node")
    first = _CountingStorage(dataset)
    # The manifest alone, as the others wait for it: the tables are in the node's cache.
    doc = _read_manifest_doc(first, first.url(MANIFEST_NAME), cache)
    assert first.reads[0] == MANIFEST_NAME and len(first.reads) == 3   # manifest + 2 tables
    other = _CountingStorage(dataset)
    m = load_manifest(other, node_cache=ChunkCache(tmp_path / "node"))
    assert other.reads == [] and m.dataset_id == doc["dataset_id"]


def test_a_damaged_shared_manifest_is_fetched_again(dataset, tmp_path):
    cache = ChunkCache(tmp_path / "node")
    load_manifest(_CountingStorage(dataset), node_cache=cache)
    recent = tmp_path / "node" / "v1" / "recent"
    (entry,) = list(recent.iterdir())
    head, _, body = entry.read_bytes().partition(b"\n")
    doc = json.loads(body)
    doc["totals"]["num_samples"] += 1                 # no longer matches its dataset_id
    entry.write_bytes(head + b"\n" + json.dumps(doc).encode())
    st = _CountingStorage(dataset)
    m = load_manifest(st, node_cache=cache)
    assert st.reads == [MANIFEST_NAME] and m.num_samples == 200


def _synthetic_dataset(root, num_row_groups: int, *, per_shard: int = 1000) -> None:
    """A manifest and side tables of ``num_row_groups`` row groups of 100 rows (no shards:
    opening a dataset reads none), as the writer lays them out."""
    write_synthetic(str(root), num_row_groups, rows=100, per_shard=per_shard)


def test_a_million_row_groups_start_in_the_same_requests(tmp_path):
    """10^3 and 10^6 row groups: the same 3 requests per node, each object once per node,
    none for the node's other processes (the row-group index is shared, not re-fetched);
    then each row-group chunk a rank reads (format v4) once per node too."""
    seen, chunks = {}, {}
    for n in (1000, 1_000_000):
        root = str(tmp_path / f"ds{n}")
        _synthetic_dataset(root, n)
        node = str(tmp_path / f"node{n}")
        ranks = [_CountingStorage(root) for _ in range(8)]
        for st in ranks:
            m = load_manifest(st, node_cache=ChunkCache(node))
            assert m.num_row_groups == n
        seen[n] = [len(st.reads) for st in ranks]
        for st in ranks:
            m = load_manifest(st, node_cache=ChunkCache(node))
            rgs = np.array([5, n // 2, n - 1])
            assert m.rg_offset[rgs].tolist() == [4 + 5 * RG_BYTES, 4 + (n // 2 % 1000) * RG_BYTES,
                                                 4 + ((n - 1) % 1000) * RG_BYTES]
        chunks[n] = [len(st.reads) for st in ranks]
    assert seen[1000] == seen[1_000_000] == [3, 0, 0, 0, 0, 0, 0, 0]
    # 10^3: one chunk; 10^6: the three row groups' three chunks; each fetched by one rank.
    assert chunks[1000] == [4, 0, 0, 0, 0, 0, 0, 0]
    assert chunks[1_000_000] == [6, 0, 0, 0, 0, 0, 0, 0]
