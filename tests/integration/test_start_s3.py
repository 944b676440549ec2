"""The start of a node against a real S3 (SeaweedFS) behind a counting, throttling proxy.

A simulated node is ``ranks`` fresh processes sharing one cache folder, each a
``ZephonLoader`` with ``workers`` DataLoader workers talking to the proxy on its own port, all
started at once; the node is done when every rank has its first batch. What the proxy saw
is the subject: the manifest, the side tables and the row-group chunk are fetched once per
node (four GETs, no HEAD, no LIST) whatever the ranks and workers, after a resume too; and a node that S3 allows
only a few requests per second starts without an error (that its processes back off together,
not alone, is measured in test_throttle_s3.py).
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers.node_start import BATCH, METADATA, behind_proxy, node_start, start_corpus
from zephon_store.testing.s3_proxy import summarize

pytestmark = pytest.mark.integration
pytest.importorskip("torch")


# As under torchrun, whose ranks are fresh processes: workers are forked (a rank is spawned,
# which spawn would inherit).
LOADER = {"with_seq": True, "multiprocessing_context": "fork"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return start_corpus(tmp_path_factory.mktemp("startcorpus"))


@pytest.fixture()
def node(corpus, s3_bucket, tmp_path):
    with behind_proxy(corpus, s3_bucket, labels=8) as (url, proxy):
        yield url, s3_bucket, proxy, tmp_path


def _metadata(reqs) -> Counter:
    return Counter((r.op, METADATA.search(r.key).group(1).split("/")[0])
                   for r in reqs if METADATA.search(r.key) and r.status != 503)


@pytest.fixture(params=["s3", "gcs", "az"])
def any_node(request, corpus, tmp_path):
    """``node`` on each object store: the start's requests do not depend on the store."""
    bucket = request.getfixturevalue(f"{request.param}_bucket")
    with behind_proxy(corpus, bucket, labels=8) as (url, proxy):
        yield url, bucket, proxy, tmp_path


def test_startup_requests_per_node_do_not_grow_with_ranks_or_workers(any_node):
    url, bucket, proxy, tmp = any_node
    seen = {}
    # 1, 4 and 8 ranks; 0 and 2 workers; a cold start and a resume at 50%. (8 x 2 is the
    # throttled test's node.)
    for ranks, workers, cursor in ((1, 0, 0), (4, 2, 0), (8, 0, 400)):
        cache = str(tmp / f"cache-{ranks}-{workers}-{cursor}")   # a fresh node each time
        start = node_start(url, bucket, proxy, cache, ranks=ranks, workers=workers,
                           cursor=cursor, **LOADER)
        reqs = start.requests
        assert sorted(start.ids) == list(range(ranks))
        assert all(len(ids) == BATCH for ids in start.ids.values())
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
    start = node_start(url, bucket, proxy, str(tmp / "cache"), ranks=8, workers=2, **LOADER)
    reqs, seconds = start.requests, start.seconds
    assert len(start.ids) == 8 and all(len(ids) == BATCH for ids in start.ids.values())
    s = summarize(reqs)
    refused_per_object = Counter(r.key for r in reqs if r.status == 503)
    # The whole loader's start survives throttling: every rank's batch, the metadata once, no
    # error. (The old code: 391 of 581 requests refused, 42.6 s.) This node now makes ~13
    # requests, too few to tell the node's shared rate from processes backing off alone: even
    # without it the node is refused only 0-5 times; test_throttle_s3.py measures that.
    assert s["throttled_503"] <= s["requests"], s
    assert _metadata(reqs) == Counter({("GET", "manifest.json"): 1, ("GET", "index"): 3})
    # Each object's requests were refused a handful of times at most, far inside the policy
    # (RetryPolicy: a 60 s deadline, delays up to 5 s; docs/storage.md).
    assert max(refused_per_object.values(), default=0) <= 8, refused_per_object
    assert s["errors"] == 0, s
    print(f"throttled 8x2 start: {seconds:.1f} s, {s}")
