"""The document table on S3 (SeaweedFS): written with the shards, fetched lazily, chunk by chunk.

A best-fit packed dataset converted to a bucket reads the same documents as its local twin;
opening the table fetches nothing beyond the manifest's side tables, a lookup fetches the
one chunk it needs (once per node: the node cache), and a damaged chunk is refused.
"""

from __future__ import annotations

import glob
import os

import pytest

import zephon_store as z
from tests.helpers import write_jsonl_corpus
from zephon_store.errors import IntegrityError
from zephon_store.read.documents import open_documents
from zephon_store.testing.golden import golden_tokenizer
from zephon_store.write.packing import PackingOptions, packing_convert_kwargs

pytestmark = pytest.mark.integration


@pytest.fixture
def remote(s3_bucket, tmp_path):
    raw = str(tmp_path / "raw")
    write_jsonl_corpus(raw, files=3, records=150, seed=9)
    tok = golden_tokenizer(str(tmp_path))
    kw = packing_convert_kwargs(PackingOptions(tokenizer=tok, seq_len=31, strategy="best-fit",
                                               buffer_windows=8))
    kw["extra_manifest"] = {**kw["extra_manifest"], "documents_per_chunk": 64}
    inputs = sorted(glob.glob(os.path.join(raw, "*.jsonl")))
    local = z.convert(inputs, str(tmp_path / "local"), progress=False, **kw)
    url = f"{s3_bucket.url}/ds"
    res = z.convert(inputs, url, storage_options=s3_bucket.storage_options, progress=False, **kw)
    assert res.dataset_id == local.dataset_id
    return url, s3_bucket.storage_options, local.url


def test_documents_read_from_s3_lazily_as_locally(remote, tmp_path):
    url, so, local_url = remote
    ds = z.open_dataset(url, storage_options=so, cache=str(tmp_path / "cache"))
    st = ds.storage.stats
    before = st.requests
    docs = open_documents(ds)
    assert st.requests - before == 3        # the index, the inputs and the text-hash tables
    local = open_documents(local_url)
    assert docs.num_documents == local.num_documents == 450 and docs.num_chunks == 8
    before = st.requests
    assert docs.find("part-001.jsonl", 7) == local.find("part-001.jsonl", 7)
    assert st.requests - before == 1        # one chunk (records bisected inside it)
    before = st.requests
    docs.document(150 + 8)                  # the same chunk: fetched already
    assert st.requests == before
    assert _listed(docs.window_spans(range(40))) == _listed(local.window_spans(range(40)))
    doc = local.document(400)
    before = st.requests
    assert docs.find_text(doc.xxh3)[0] == doc     # one hash bucket, one chunk
    assert st.requests - before == 2
    assert [docs.document(d) for d in range(0, 450, 50)] == \
        [local.document(d) for d in range(0, 450, 50)]
    # Another process of the node reads the chunks from the node cache, not from S3.
    ds2 = z.open_dataset(url, storage_options=so, cache=str(tmp_path / "cache"))
    again = open_documents(ds2)
    before = ds2.storage.stats.requests
    assert again.document(157) == local.document(157)
    assert ds2.storage.stats.requests == before


def _listed(spans) -> list:
    return [col.tolist() for col in spans]


def test_a_damaged_chunk_on_s3_is_refused(remote, tmp_path):
    import s3fs

    url, so, _ = remote
    # Bytes that fail their hash are re-fetched within the read deadline before they are
    # called corrupt (docs/storage.md): a short one, as this chunk stays damaged.
    ro = {**so, "retry": {"deadline": 1.0, "base_delay": 0.01, "max_delay": 0.05}}
    ds = z.open_dataset(url, storage_options=ro, cache=False)
    ref = open_documents(ds)._digests[1]
    fs = s3fs.S3FileSystem(**so, skip_instance_cache=True)
    path = url.removeprefix("s3://") + f"/index/{ref}.arrow"
    data = bytearray(fs.cat_file(path))
    data[10] ^= 0xFF
    fs.pipe_file(path, bytes(data))
    fresh = open_documents(z.open_dataset(url, storage_options=ro, cache=False))
    with pytest.raises(IntegrityError, match="xxh3"):
        fresh.document(64)
    assert not z.verify(url, storage_options=ro).ok
