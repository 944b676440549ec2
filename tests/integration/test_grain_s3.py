"""ZephonSource over a dataset on the local S3 server (SeaweedFS): a batched read fetches the
row groups it needs in coalesced, verified ranged GETs, not one request per index or per row
group, and feeds a Grain pipeline the same records as the local copy."""

from __future__ import annotations

import glob
import os

import grain
import numpy as np
import pytest

import zephon_store as z
from tests.helpers import write_jsonl_corpus
from zephon_store.grain import ZephonSource

pytestmark = pytest.mark.integration


@pytest.fixture
def remote(s3_bucket, tmp_path):
    raw = str(tmp_path / "raw")
    write_jsonl_corpus(raw, files=2, records=200, seed=3)
    options = z.WriteOptions(row_group_rows=20, target_shard_bytes=1 << 20, row_group_bytes=None)
    inputs = sorted(glob.glob(os.path.join(raw, "*.jsonl")))
    z.convert(inputs, str(tmp_path / "local"), options=options, progress=False)
    url = f"{s3_bucket.url}/ds"
    z.convert(inputs, url, options=options, storage_options=s3_bucket.storage_options,
              progress=False)
    return url, s3_bucket.storage_options, str(tmp_path / "local")


def _requests(src: ZephonSource) -> int:
    return src.source.storage.stats.requests


def test_a_batched_read_is_a_few_coalesced_gets(remote, tmp_path):
    url, so, local = remote
    src = ZephonSource(url, storage_options=so, cache=str(tmp_path / "cache"))
    m = src.source.manifest
    assert m.num_row_groups == 20 and m.num_shards == 1
    src[0]                                       # the footer and row group 0
    idx = list(range(20, 400, 7))                # 55 indices over the other 19 row groups
    before = _requests(src)
    got = src._getitems(idx)
    assert _requests(src) - before == 1          # one ranged GET, not 19 or 55
    assert [int(r["id"]) for r in got] == idx
    local_records = ZephonSource(local)._getitems(idx)
    assert [{k: np.asarray(v).tolist() for k, v in r.items()} for r in got] == \
        [{k: np.asarray(v).tolist() for k, v in r.items()} for r in local_records]
    # Read again: every row group is decoded and cached; no request at all.
    before = _requests(src)
    src._getitems(idx[::-1])
    assert _requests(src) == before
    # The same indices one by one (a source without the batched read) cost a GET per row group.
    alone = ZephonSource(url, storage_options=so, cache=str(tmp_path / "cache2"))
    alone[0]
    before = _requests(alone)
    for i in idx:
        alone[i]
    assert _requests(alone) - before == 19


def test_a_grain_pipeline_over_s3_reads_what_the_local_copy_holds(remote, tmp_path):
    url, so, local = remote
    remote_src = ZephonSource(url, storage_options=so, cache=str(tmp_path / "c"))
    local_src = ZephonSource(local)

    def pipeline(source):
        return grain.MapDataset.range(400).shuffle(seed=4).batch(25).map(source.read_batch)

    remote_ds, local_ds = pipeline(remote_src), pipeline(local_src)
    opened = _requests(remote_src)                    # the manifest and its side tables
    first = remote_ds[0]
    # 25 shuffled samples over most of the 20 row groups: the footer and the row-group chunk
    # (format v4: their byte ranges and hashes), then one ranged GET.
    assert len(set((first["id"] // 20).tolist())) > 10
    assert _requests(remote_src) - opened == 3
    for i in range(4):
        assert remote_ds[i]["id"].tolist() == local_ds[i]["id"].tolist()
        assert remote_ds[i]["text"] == local_ds[i]["text"]


def test_indexed_by_order_a_remote_source_fetches_the_next_row_groups_ahead(remote, tmp_path):
    """Remote and indexed by Zephon's order, the source fetches and decodes the row groups
    of the positions after the last read in its threads (its default: docs/benchmarks.md,
    "Grain's random-access source"); over a pass it fetches what a source without
    decode-ahead fetches, each row group once, and reads the same records."""
    from zephon_store import OrderOptions, ReadAheadOptions, SourceOptions

    url, so, local = remote
    order = OrderOptions(seed=3, window_blocks=2, lanes=1)

    def source(name: str, **read_ahead) -> ZephonSource:
        return ZephonSource(url, order=order, columns=["id"],
                            read_ahead=ReadAheadOptions(**read_ahead),
                            source=SourceOptions(storage_options=so, cache=str(tmp_path / name)))

    src, plain = source("ahead"), source("plain", decode_ahead_bytes=0)
    assert src._ahead is not None and plain._ahead is None
    got, want = [int(src[0]["id"])], [int(plain[0]["id"])]
    pool, src._pool = src._pool, None
    pool.shutdown(wait=True)                     # the fetches queued ahead are done
    assert _requests(src) > _requests(plain)     # the next row groups, fetched already
    got += [int(src[p]["id"]) for p in range(1, len(src))]
    want += [int(plain[p]["id"]) for p in range(1, len(plain))]
    assert got == want
    assert _requests(src) == _requests(plain)    # each row group once either way
