"""The start of a node against a real S3 (SeaweedFS) behind a counting, throttling proxy.

A simulated node is ``ranks`` fresh processes sharing one cache folder, each a
``ZephonLoader`` with ``workers`` DataLoader workers talking to the proxy on its own port, all
started at once; the node is done when every rank has its first batch. What the proxy saw
is the subject: the manifest, the side tables and the row-group chunk are fetched once per
node (four GETs, no HEAD, no LIST) whatever the ranks and workers, after a resume too; and a node that S3 allows
only a few requests per second starts without an error, refused no more often than served.
"""

from __future__ import annotations

import multiprocessing
import re
import time
from collections import Counter

import pytest

from tests.helpers import write_jsonl_corpus
from zephon_store import convert
from zephon_store.testing.s3_proxy import CountingProxy, summarize
from zephon_store.write.shardwriter import WriteOptions

pytestmark = pytest.mark.integration
pytest.importorskip("torch")

OPTS = WriteOptions(target_shard_bytes=40 << 10, row_group_bytes=6 << 10)
BATCH = 4            # samples per rank per step
METADATA = re.compile(r"/(manifest\.json|index/[0-9a-f]{32}\.arrow)$")


def _rank(url: str, so: dict, cache: str, rank: int, ranks: int, workers: int, cursor: int,
          barrier, results) -> None:
    """One rank of the node: import, wait for the others, then take the first batch."""
    try:
        from zephon_store.order import OrderOptions
        from zephon_store.torch import ZephonLoader

        barrier.wait(120)
        loader = ZephonLoader(url, global_batch=BATCH * ranks, world_size=ranks, rank=rank,
                              ranks_per_node=ranks, num_workers=workers,
                              order=OrderOptions(seed=3), storage_options=so, cache=cache,
                              collate=None, with_seq=True,
                              # As under torchrun, whose ranks are fresh processes: workers
                              # are forked (this rank was spawned, which spawn would inherit).
                              multiprocessing_context="fork")
        if cursor:
            loader.load_state_dict(dict(loader.state_dict(), cursor=cursor))
        it = iter(loader)
        batch = next(it)
        results.put((rank, sorted(int(s) for s in batch["_seq"]), None))
        barrier.wait(120)   # keep the loader (and its workers) alive until every rank is done
    except Exception as exc:   # noqa: BLE001 - reported to the test, which fails on it
        results.put((rank, None, f"{type(exc).__name__}: {exc}"))
        barrier.abort()


def _node_start(url: str, bucket, proxy: CountingProxy, cache: str, *, ranks: int,
                workers: int, cursor: int = 0) -> tuple[list, dict, float]:
    """Start a node; returns (every rank's first-batch ids, the proxy's requests until the
    last rank had its batch, the seconds that took)."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(ranks + 1), ctx.Queue()
    procs = [ctx.Process(target=_rank, daemon=False,
                         args=(url, bucket.options_via(proxy.endpoint_url(r), read_timeout=10),
                               cache, r, ranks, workers, cursor, barrier, results))
             for r in range(ranks)]
    for p in procs:
        p.start()
    try:
        barrier.wait(180)   # every rank has imported
        proxy.reset()
        t0 = time.monotonic()
        got = [results.get(timeout=180) for _ in range(ranks)]
        seconds = time.monotonic() - t0
        reqs = proxy.snapshot()
        errors = [f"rank {r}: {err}" for r, _, err in got if err]
        assert not errors, errors
        barrier.wait(60)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    return sorted(got), reqs, seconds


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("startcorpus")
    write_jsonl_corpus(d / "src", files=2, records=400, seed=4)
    return d / "src"


@pytest.fixture()
def node(corpus, s3_bucket, tmp_path):
    url = f"{s3_bucket.url}/ds"
    convert([str(corpus)], url, options=OPTS, storage_options=s3_bucket.storage_options)
    with CountingProxy(s3_bucket.server.ports["s3"], labels=8) as proxy:
        yield url, s3_bucket, proxy, tmp_path


def _metadata(reqs) -> Counter:
    return Counter((r.op, METADATA.search(r.key).group(1).split("/")[0])
                   for r in reqs if METADATA.search(r.key) and r.status != 503)


def test_startup_requests_per_node_do_not_grow_with_ranks_or_workers(node):
    url, bucket, proxy, tmp = node
    seen = {}
    # 1, 4 and 8 ranks; 0 and 2 workers; a cold start and a resume at 50%. (8 x 2 is the
    # throttled test's node.)
    for ranks, workers, cursor in ((1, 0, 0), (4, 2, 0), (8, 0, 400)):
        cache = str(tmp / f"cache-{ranks}-{workers}-{cursor}")   # a fresh node each time
        got, reqs, _ = _node_start(url, bucket, proxy, cache, ranks=ranks, workers=workers,
                                   cursor=cursor)
        assert [r for r, _, _ in got] == list(range(ranks))
        assert all(len(ids) == BATCH for _, ids, _ in got)
        ops = Counter(r.op for r in reqs)
        # No HEAD before a GET, no LIST anywhere on the read path.
        assert ops["HEAD"] == ops["LIST"] == ops["PUT"] == 0, (ranks, workers, ops)
        seen[(ranks, workers, cursor)] = _metadata(reqs)
    # One GET of the manifest, one of each side table and one of the row-group chunk (format
    # v4; this dataset has one) per node, whatever the ranks, workers or cursor (the old
    # code: 6 requests per rank, HEAD + GET of each).
    want = Counter({("GET", "manifest.json"): 1, ("GET", "index"): 3})
    assert all(c == want for c in seen.values()), seen


def test_throttled_node_start_completes_without_amplifying(node):
    url, bucket, proxy, tmp = node
    proxy.throttle(5.0)   # about one node's share when ~1,000 nodes start on one prefix
    got, reqs, seconds = _node_start(url, bucket, proxy, str(tmp / "cache"), ranks=8,
                                     workers=2)
    assert len(got) == 8 and all(len(ids) == BATCH for _, ids, _ in got)
    s = summarize(reqs)
    refused_per_object = Counter(r.key for r in reqs if r.status == 503)
    # Not amplified: the node's shared back-off makes refusals the exception (the old code,
    # each process retrying alone after 0.1 s: 391 of 581 requests refused, 42.6 s).
    assert s["throttled_503"] <= s["requests"], s
    assert _metadata(reqs) == Counter({("GET", "manifest.json"): 1, ("GET", "index"): 3})
    # Each object's requests were refused a handful of times at most, far inside the policy
    # (RetryPolicy: a 60 s deadline, delays up to 5 s; docs/storage.md).
    assert max(refused_per_object.values(), default=0) <= 8, refused_per_object
    assert s["errors"] == 0, s
    print(f"throttled 8x2 start: {seconds:.1f} s, {s}")
