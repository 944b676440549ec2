"""A rank's start at 10^6 row groups reads what it does at 10^3 (format v4, issue 31).

Synthetic v4 datasets (``zephon_store/testing/synthetic.py``: the manifest and side tables
as the writer lays them out, no shards) on a real S3 (SeaweedFS) behind the counting proxy.
A rank opens the dataset with a fresh node cache and plans its first step as the loader
does (``RankStream.row_groups``, then the byte ranges the prefetcher fetches and their
hashes); what it fetched of ``manifest.json`` and ``index/*.arrow`` is the subject. v3 read
every row group's details (~64 MB per rank at 10^6); v4 reads the row counts of all and
the chunk of each row group it reads.

Both row-count variants share one bucket per module: their chunks of byte ranges and hashes
do not depend on the row counts, so they are the same content-hashed objects, uploaded once;
what differs (``manifest.json``, the shard and row-count tables) is uploaded by each test
before it reads. The 10^6 upload (~1,000 objects) was most of each test's time.
"""

from __future__ import annotations

import contextlib
import re
import uuid

import numpy as np
import pytest

from zephon_store import open_dataset
from zephon_store.load.stream import RankStream
from zephon_store.order import OrderOptions
from zephon_store.order.topology import Topology
from zephon_store.testing.s3_proxy import CountingProxy
from zephon_store.testing.synthetic import synthetic_files

pytestmark = pytest.mark.integration

METADATA = re.compile(r"/(manifest\.json|index/[0-9a-f]{32}\.arrow)$")
TOPOLOGY = Topology(global_batch=64, world_size=8, rank=3, ranks_per_node=8)
INDEX_BUDGET = 2 << 20     # the most a rank may fetch of the index (issue 31)


class _Bucket:
    """A bucket for this module; :meth:`upload` skips the objects this module already put
    there with the same bytes (the shared chunks) and puts the rest."""

    def __init__(self, server, fs, name: str):
        self.server, self.fs, self.name = server, fs, name
        self._put: dict[str, bytes] = {}

    def upload(self, prefix: str, files: dict[str, bytes]) -> str:
        todo = {f"{self.name}/{prefix}/{rel}": data for rel, data in files.items()
                if self._put.get(f"{prefix}/{rel}") != data}
        self.fs.pipe(todo, batch_size=16)       # concurrent PUTs, 16 at a time
        self._put.update({f"{prefix}/{rel}": data for rel, data in files.items()})
        return f"s3://{self.name}/{prefix}"


@pytest.fixture(scope="module")
def bucket(s3_server):
    import s3fs

    # Generous timeouts: the upload is set-up, not the subject (the reads keep the defaults).
    fs = s3fs.S3FileSystem(**s3_server.storage_options(read_timeout=60, connect_timeout=30),
                           skip_instance_cache=True, use_listings_cache=False)
    name = f"t-{uuid.uuid4().hex[:16]}"
    fs.mkdir(name)
    yield _Bucket(s3_server, fs, name)
    with contextlib.suppress(Exception):
        fs.rm(name, recursive=True)


def _rank_start(url: str, so: dict, cache: str, *, resume: bool) -> tuple[np.ndarray, object]:
    """Open, plan the first step (at 50% when ``resume``), resolve what reading it needs."""
    ds = open_dataset(url, storage_options=so, cache=cache)
    stream = RankStream(ds, OrderOptions(seed=3), TOPOLOGY)
    cursor = ds.num_samples // 2 // TOPOLOGY.global_batch * TOPOLOGY.global_batch if resume else 0
    rgs = stream.row_groups(cursor)
    spans = ds.row_groups.range_fetcher().spans(rgs)     # the prefetcher's byte ranges
    hashes = [ds.manifest.rg_xxh3(r) for r in rgs]       # what each range is checked against
    assert len(spans) == len(hashes) == len(rgs) > 0
    return rgs, ds.manifest


@pytest.mark.parametrize("rows", ["fixed", "variable"])
def test_start_and_resume_at_a_million_row_groups(bucket, tmp_path, rows):
    seen = {}
    for n in (1_000, 1_000_000):
        counts = (2048 if rows == "fixed"
                  else np.random.default_rng(n).integers(200, 3000, n))   # text: ~11 bits each
        url = bucket.upload(f"ds{n}", synthetic_files(n, rows=counts))
        with CountingProxy(bucket.server.ports["s3"]) as proxy:
            so = bucket.server.storage_options(proxy.endpoint_url(0), read_timeout=10)
            for resume in (False, True):
                proxy.reset()
                rgs, m = _rank_start(url, so, str(tmp_path / f"cache-{n}-{resume}"),
                                     resume=resume)
                # This variant's manifest (both variants publish at the same prefixes).
                assert m.num_samples == int(np.broadcast_to(counts, n).sum()), rows
                reqs = [r for r in proxy.snapshot() if r.status != 503]
                meta = [r for r in reqs if METADATA.search(r.key)]
                assert len(meta) == len(reqs), "nothing but the index was fetched"
                assert {r.op for r in reqs} == {"GET"}   # no HEAD, no LIST
                chunks = np.unique(rgs // m.details.per_chunk)
                seen[n, resume] = (len(meta), sum(r.nbytes for r in meta), len(chunks))
    for resume in (False, True):
        small, big = seen[1_000, resume], seen[1_000_000, resume]
        # 10^3: the manifest, the shard table, the row-group index and its one chunk.
        assert small[0] == 4 and small[2] == 1, seen
        # 10^6: the same three objects plus one chunk per distinct chunk the step reads
        # (at most one per row group it reads: "+k", fetched at once, in one round trip).
        assert big[0] == 3 + big[2], seen
        assert big[1] <= INDEX_BUDGET, seen
    print(f"{rows}: (requests, index bytes, chunks) {seen}")
