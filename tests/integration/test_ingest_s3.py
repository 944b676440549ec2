"""S3 inputs through the fault proxy: listings, opens and mid-stream reads are retried, the
bytes read are exactly the object's, and errors that outlast the retries name the file."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs
import zstandard

from tests.helpers.faultproxy import FaultProxy
from zephon_store.errors import StorageError
from zephon_store.ingest import expand_inputs, open_stream, read_input
from zephon_store.ingest import source as source_mod
from zephon_store.read.dataset import open_dataset
from zephon_store.write.convert import convert

pytestmark = pytest.mark.integration

RECORDS = [{"id": i, "text": f"record {i} " + "w" * (i % 53)} for i in range(3000)]
JSONL = "".join(json.dumps(r) + "\n" for r in RECORDS).encode()
# Small ranges, so one input takes many GETs and faults land in the middle of a stream.
BLOCK = 16 << 10
RETRY = {"deadline": 20.0, "base_delay": 0.01, "max_delay": 0.05}


@pytest.fixture
def proxy(s3_bucket):
    with FaultProxy(s3_bucket.server.ports["s3"]) as p:
        yield p


@pytest.fixture
def raw(s3_bucket, tmp_path, monkeypatch):
    """``s3://<bucket>/raw/`` holding the same records as JSONL.zst, Parquet (with page
    checksums) and CSV.gz; also written locally under ``tmp_path/raw``."""
    monkeypatch.setattr(source_mod, "BLOCK_BYTES", BLOCK)
    local = tmp_path / "raw"
    local.mkdir()
    (local / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=1).compress(JSONL))
    pq.write_table(pa.Table.from_pylist(RECORDS), local / "b.parquet", row_group_size=1000,
                   write_page_checksum=True)
    csv = "id,text\n" + "".join(f"{r['id']},\"{r['text']}\"\n" for r in RECORDS)
    (local / "c.csv.gz").write_bytes(gzip.compress(csv.encode(), mtime=0))
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True)
    for path in sorted(local.iterdir()):
        fs.pipe(f"{s3_bucket.name}/raw/{path.name}", path.read_bytes())
    return f"{s3_bucket.url}/raw/"


def _options(s3_bucket, proxy, **retry) -> dict:
    return dict(s3_bucket.options_via(proxy.endpoint_url, read_timeout=2.0, connect_timeout=1.0),
                retry={**RETRY, **retry})


def _records(files, options) -> list[list[dict]]:
    return [[{k: str(v) for k, v in r.items()}
             for b in read_input(f, storage_options=options) for r in b.to_pylist()]
            for f in files]


def test_faults_on_listing_opens_and_reads_are_retried_and_records_are_exact(
        raw, s3_bucket, proxy):
    options = _options(s3_bucket, proxy)
    proxy.http503_next(1)  # the listing
    files = expand_inputs([raw], storage_options=options)
    assert [f.url.rsplit("/", 1)[1] for f in files] == ["a.jsonl.zst", "b.parquet", "c.csv.gz"]
    assert proxy.injected == 1
    want = [{k: str(v) for k, v in r.items()} for r in RECORDS]
    for f in files:
        # A 503, a reset and a body cut short on the next requests: the HEAD of the open and
        # ranged GETs of this file, wherever they fall.
        proxy.http503_next(1)
        proxy.reset_next(1)
        proxy.truncate_next(1, nbytes=1000)
        before = proxy.injected
        assert _records([f], options) == [want], f.url
        assert proxy.injected == before + 3


def test_a_stream_resumes_at_the_byte_it_reached(raw, s3_bucket, proxy):
    options = _options(s3_bucket, proxy)
    url = f"{s3_bucket.url}/plain/d.jsonl"
    s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True).pipe(url, JSONL)
    (f,) = expand_inputs([url], storage_options=options)
    with open_stream(f, options) as stream:
        head = stream.read(1000)  # the first ranges are fetched
        proxy.truncate_next(1, nbytes=5000)
        proxy.reset_next(1)
        proxy.http503_next(1)
        rest = stream.read()
    assert head + rest == JSONL  # nothing lost, nothing doubled
    assert proxy.injected == 3
    gets = [t for m, t, _ in proxy.log if m == "GET" and "d.jsonl" in t]
    assert len(gets) >= 3 + -(-f.size // BLOCK)


def test_an_error_after_the_retries_names_the_file(raw, s3_bucket, proxy):
    options = _options(s3_bucket, proxy, deadline=1.0)
    (f,) = expand_inputs([raw + "b.parquet"], storage_options=options)
    proxy.down_forever()
    with pytest.raises(StorageError) as err:
        list(read_input(f, storage_options=options))
    assert f"{raw}b.parquet: gave up after" in str(err.value)
    assert err.value.url == f"{raw}b.parquet"


def test_convert_from_s3_inputs_through_faults_is_exact(raw, s3_bucket, proxy, tmp_path):
    options = _options(s3_bucket, proxy)
    proxy.http503_next(2)
    proxy.reset_next(2)
    proxy.truncate_next(2, nbytes=700)
    # JSON Lines and Parquet agree on types (CSV columns are strings).
    result = convert([raw + "a.jsonl.zst", raw + "b.parquet"], str(tmp_path / "out"),
                     input_storage_options=options, progress=False)
    assert proxy.injected == 6
    with open_dataset(str(tmp_path / "out")) as ds:
        rows = ds.take(list(range(result.num_samples))).to_pylist()
    got = sorted((str(r["id"]), r["text"]) for r in rows)
    assert got == sorted((str(r["id"]), r["text"]) for r in RECORDS * 2)


@pytest.mark.parametrize("listing", ["folder", "glob", "file"])
def test_a_rerun_over_s3_inputs_reads_none_until_one_changes(s3_bucket, tmp_path, proxy,
                                                              listing):
    """Rerunning convert over its own output (issue 41 item 3) lists the S3 inputs and GETs
    none; an object rewritten in place with the same size (a new ETag) is converted again,
    which the staging's job key once missed (it keyed objects by size alone)."""
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True)
    for k in range(2):
        part = RECORDS[k * 500:(k + 1) * 500]
        fs.pipe(f"{s3_bucket.name}/in/p{k}.jsonl",
                "".join(json.dumps(r) + "\n" for r in part).encode())
    src = {"folder": f"{s3_bucket.url}/in/", "glob": f"{s3_bucket.url}/in/*.jsonl",
           "file": f"{s3_bucket.url}/in/p1.jsonl"}[listing]
    options = _options(s3_bucket, proxy)
    out = str(tmp_path / "out")

    def reads() -> int:   # GETs of an input object (a listing is a GET of the bucket)
        return sum(1 for m, t, _ in proxy.log if m == "GET" and "/in/p" in t)

    first = convert([src], out, input_storage_options=options)
    assert reads() > 0
    before = reads()
    again = convert([src], out, input_storage_options=options)
    assert again.unchanged and again.dataset_id == first.dataset_id
    assert reads() == before   # listings and HEADs only: no input was read
    body = fs.cat(f"{s3_bucket.name}/in/p1.jsonl")
    fs.pipe(f"{s3_bucket.name}/in/p1.jsonl", body.replace(b"record", b"rekord"))
    third = convert([src], out, input_storage_options=options, overwrite=True)
    assert not third.unchanged and third.inputs_reused == 0
    assert third.dataset_id != first.dataset_id


def test_an_arrow_ipc_input_on_s3_reads_exactly_through_faults(s3_bucket, proxy, monkeypatch):
    monkeypatch.setattr(source_mod, "BLOCK_BYTES", BLOCK)
    table = pa.Table.from_pylist(RECORDS)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=700)
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True)
    fs.pipe(f"{s3_bucket.name}/ipc/d.arrow", sink.getvalue().to_pybytes())
    options = _options(s3_bucket, proxy)
    (f,) = expand_inputs([f"{s3_bucket.url}/ipc/d.arrow"], storage_options=options)
    assert f.kind == "arrow"
    proxy.http503_next(1)
    proxy.reset_next(1)
    before = proxy.injected
    assert [r for b in read_input(f, storage_options=options) for r in b.to_pylist()] == RECORDS
    assert proxy.injected == before + 2
