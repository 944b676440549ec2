"""``gs://`` and ``az://`` end to end against real servers started by the session on
127.0.0.1 (fake-gcs-server for GCS's JSON API, Azurite for Azure Blob): convert, verify, get,
plan, cache fill, the loader's torture schedule equal to the local run id for id, faults
through the proxy, and the conditional writes the output lock relies on (GCS generation
preconditions, Azure ETags). (S3 has the same tests in test_s3_loader.py and
test_storage_s3.py.)

fake-gcs-server checks no credentials, and ignores ``ifGenerationMatch`` on DELETE; Azurite
checks Shared Key signatures but takes OAuth tokens only over HTTPS. An expired token is
therefore tested with the 401 coming from the proxy in front of the server (below).
"""

from __future__ import annotations

import json
import time
import types

import pytest

from tests.helpers.faultproxy import FaultProxy
from tests.helpers.stateful import Segment, run_segments
from tests.integration import test_s3_loader as s3_tests
from zephon_store import BatchOptions, StopOptions, Topology, WorkerOptions, convert, open_dataset
from zephon_store._util.hashing import xxh3_hex
from zephon_store.cli.main import main
from zephon_store.errors import (
    AccessDeniedError,
    InputError,
    IntegrityError,
    ShardNotFoundError,
)
from zephon_store.io.retry import RetryPolicy
from zephon_store.io.storage import Storage
from zephon_store.testing.azurite_server import ACCOUNT

pytestmark = pytest.mark.integration
# The S3 end-to-end tests' corpus (a module fixture) and helpers: the same data on each store.
corpus = s3_tests.corpus
OPTS, ORDER, _open = s3_tests.OPTS, s3_tests.ORDER, s3_tests._open
torch = pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402

B = 16
RIDE = RetryPolicy(base_delay=0.02, max_delay=0.2, deadline=20.0)


@pytest.fixture(params=["gcs", "az"])
def bucket(request):
    """A fresh bucket (container) on each store of zephon's own clients."""
    return request.getfixturevalue(f"{request.param}_bucket")


@pytest.fixture()
def remote(corpus, bucket):
    url = f"{bucket.url}/ds"
    res = convert([str(corpus / "src")], url, options=OPTS,
                  storage_options=bucket.storage_options, workers=2)
    return url, bucket, res


def _stream(ds, steps):
    loader = ZephonLoader(ds, topology=Topology(B, 1, 0), order=ORDER,
                          batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=steps),
                          workers=WorkerOptions(prefetch=2))
    ids, texts = [], []
    for batch in loader:
        ids.extend(batch["_seq"].tolist())
        texts.extend(batch["text"])
    return ids, texts


def test_storage_round_trip_and_conditional_writes(bucket):
    st = Storage(f"{bucket.url}/ds", storage_options=bucket.storage_options)
    data = bytes(range(256)) * 64
    st.write_atomic("shards/a.bin", data)
    assert st.read_range("shards/a.bin", 10, 5000, expected_xxh3=xxh3_hex(data[10:5000])) \
        == data[10:5000]
    assert st.read_file("shards/a.bin") == data and st.size("shards/a.bin") == len(data)
    assert st.listdir("") == ["shards"] and st.sizes("shards") == {"shards/a.bin": len(data)}
    with pytest.raises(ShardNotFoundError, match=f"{bucket.url}/ds/shards/none.bin"):
        st.read_range("shards/none.bin", 0, 10)
    # The lock's writes: create-only (ifGenerationMatch=0, If-None-Match: *), compare-and-swap
    # on a generation or an ETag.
    assert st.create_exclusive("k", b"one") and not st.create_exclusive("k", b"two")
    got, gen = st.read_with_etag("k")
    assert got == b"one"
    assert not st.replace_if_match("k", b"x", "1" if bucket.url.startswith("gs") else '"0x1"')
    assert st.replace_if_match("k", b"three", gen)
    assert not st.replace_if_match("k", b"four", gen)   # the generation it was judged by
    assert st.read_file("k") == b"three"
    if bucket.url.startswith("az"):   # fake-gcs-server ignores a DELETE's precondition
        assert not st.delete_if_match("k", gen) and st.exists("k")
    st.delete("k")
    assert not st.exists("k") and not st.replace_if_match("k", b"five", gen)


def test_unknown_options_and_denied_requests_say_what_to_do(bucket):
    scheme = bucket.url.split("://")[0]
    with pytest.raises(Exception, match=f"unknown storage option 'bogus' for {scheme}://"):
        Storage(f"{bucket.url}/ds", storage_options={"bogus": "k"}).read_file("x")
    with FaultProxy(bucket.server.port) as proxy:
        st = Storage(f"{bucket.url}/ds",
                     storage_options=bucket.options_via(proxy.endpoint_url))
        proxy.http_status_next(403, 1)
        hint = "GOOGLE_APPLICATION_CREDENTIALS" if scheme == "gs" else "account_key"
        with pytest.raises(AccessDeniedError, match=hint):
            st.read_file("x")
        assert proxy.requests == 1   # never retried


def test_convert_verify_get_plan_cache_fill(corpus, remote, tmp_path, capsys):
    url, bucket, res = remote
    local = open_dataset(str(corpus / "local"))
    assert res.dataset_id == local.dataset_id   # same bytes wherever they are stored
    so = ["--storage-options", json.dumps(bucket.storage_options)]
    assert main(["verify", url, "--deep", *so]) == 0
    capsys.readouterr()
    assert main(["get", url, "3", "700", "--json", *so]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows == local.take([3, 700]).to_pylist()
    assert main(["plan", url, "--world-size", "2", "--global-batch", "8", "--json", *so]) == 0
    assert main(["plan", str(corpus / "local"), "--world-size", "2", "--global-batch", "8",
                 "--json"]) == 0
    remote_plan, local_plan = _two_json(capsys)
    assert remote_plan == local_plan
    assert main(["cache", "fill", url, "--dir", str(tmp_path / "c"), "--json", *so]) == 0


def _two_json(capsys):
    out = capsys.readouterr().out
    dec = json.JSONDecoder()
    first, end = dec.raw_decode(out)
    second, _ = dec.raw_decode(out[end:].lstrip())
    for doc in (first, second):
        doc.pop("dataset_url", None)
        doc.pop("url", None)
    return first, second


def test_torture_schedule_equals_the_local_run(corpus, remote, tmp_path):
    """World size, global batch and workers change across resumes (each resume from the JSON
    checkpoint of the last step); every rank's ids of every step equal the local run's."""
    url, bucket, _ = remote
    ds = _open(url, bucket.storage_options, tmp_path)

    def make(dataset):
        def loader(*, world_size, rank, num_workers, global_batch):
            return ZephonLoader(dataset, topology=Topology(global_batch, world_size, rank),
                                order=ORDER, workers=WorkerOptions(num_workers=num_workers),
                                batch=BatchOptions(with_seq=True))
        return loader

    segments = [Segment(world_size=2, steps=3),
                Segment(world_size=1, steps=2, num_workers=2, global_batch=24),
                Segment(world_size=3, steps=3, global_batch=12)]
    remote_run = run_segments(make(ds), segments, global_batch=B)
    local_run = run_segments(make(open_dataset(str(corpus / "local"))), segments,
                             global_batch=B)
    assert [s.ids for s in remote_run.steps] == [s.ids for s in local_run.steps]
    assert remote_run.states == local_run.states and len(remote_run.steps) == 8


@pytest.mark.parametrize("fault", ["reset", "http503", "http429", "truncate", "corrupt",
                                   "down"])
def test_faults_while_streaming_do_not_change_the_output(corpus, remote, tmp_path, fault):
    url, bucket, _ = remote
    steps = 12
    want = _stream(open_dataset(str(corpus / "local")), steps)
    with FaultProxy(bucket.server.port) as proxy:
        so = bucket.options_via(proxy.endpoint_url, read_timeout=1.0, connect_timeout=1.0)
        ds = _open(url, so, tmp_path, retry=RIDE)
        {"reset": lambda: proxy.reset_next(3), "http503": lambda: proxy.http503_next(3),
         "http429": lambda: proxy.http_status_next(429, 3),
         "truncate": lambda: proxy.truncate_next(2, 200),
         "corrupt": lambda: proxy.corrupt_next(10, path=".parquet"),
         "down": lambda: proxy.down(1.0)}[fault]()
        assert _stream(ds, steps) == want
        if fault != "down":
            assert proxy.injected >= 1
        assert ds.storage.stats.retries >= 1


def test_a_corrupt_object_is_named_with_zephon_verify(remote, tmp_path):
    url, bucket, _ = remote
    ds = _open(url, bucket.storage_options, tmp_path,
               retry=RetryPolicy(base_delay=0.05, max_delay=0.2, deadline=1.0))
    m = ds.manifest
    st = Storage(url, storage_options=bucket.storage_options)
    rel = m.shard_path(int(m.rg_shard[0]))
    data = bytearray(st.read_file(rel))
    data[int(m.rg_offset[0]) + 5] ^= 0x01
    st.write_atomic(rel, bytes(data))
    with pytest.raises(IntegrityError) as e:
        ds.take([0])
    assert e.value.url == f"{url}/{rel}" and f"zephon verify {url}" in str(e.value)
    assert ds.storage.stats.integrity_failures >= 2   # re-fetched after a back-off first


def test_an_expired_token_is_refreshed_and_the_request_sent_once_more(gcs_bucket):
    """A 401 (a token that expired between its refresh and the GET) refreshes the credentials
    through their provider and sends the request again, once; fake-gcs-server checks no
    tokens, so the 401 comes from the proxy in front of it."""
    st = Storage(f"{gcs_bucket.url}/ds", storage_options=gcs_bucket.storage_options)
    st.write_atomic("a.bin", b"payload")
    with FaultProxy(gcs_bucket.server.port) as proxy:
        creds = _Rotating()
        so = {**gcs_bucket.options_via(proxy.endpoint_url), "token": creds}
        reader = Storage(f"{gcs_bucket.url}/ds", storage_options=so)
        assert reader.read_file("a.bin") == b"payload" and creds.issued == 1
        proxy.http_status_next(401, 1)
        assert reader.read_file("a.bin") == b"payload"
        assert creds.issued == 2 and reader.stats.retries == 0 and proxy.requests == 3
        assert proxy.auth_seen == ["Bearer token-1", "Bearer token-1",
                                                "Bearer token-2"]
        proxy.http_status_next(401, 2)   # still refused with a fresh token: denied
        with pytest.raises(AccessDeniedError):
            reader.read_file("a.bin")


class _Rotating:
    """google-auth's credentials interface (``valid``, ``token``, ``refresh``): each refresh
    issues a new token, as a workload-identity provider does."""

    def __init__(self) -> None:
        self.issued = 0
        self.token: str | None = None

    @property
    def valid(self) -> bool:
        return self.token is not None

    def refresh(self, request) -> None:
        self.issued += 1
        self.token = f"token-{self.issued}"


def test_an_expired_azure_token_is_replaced_before_and_after_the_store_refuses_it(az_bucket):
    """A token credential is asked again when its token is about to expire (e.g. between the
    prefetch plan and the GET: the check is at each request) and after a 401 or a 403
    ``AuthenticationFailed``, and the refused request is sent once more. Azurite takes OAuth
    only over HTTPS, so the container is public (Azurite then ignores the token) and the
    refusals come from the proxy in front of it."""
    server = az_bucket.server
    pub = f"az://{az_bucket.name}-pub/ds"
    server.create_container(f"{az_bucket.name}-pub", public=True)
    writer = Storage(pub, storage_options=server.storage_options())
    writer.write_atomic("a.bin", b"payload")
    with FaultProxy(server.port) as proxy:
        creds = _AzureTokens(lifetime=3600)
        so = {**server.storage_options(proxy.endpoint_url), "credential": creds}
        del so["account_key"]
        reader = Storage(pub, storage_options=so)
        assert reader.read_file("a.bin") == b"payload" and creds.issued == 1
        proxy.http_status_next(401, 1)
        assert reader.read_file("a.bin") == b"payload" and creds.issued == 2
        proxy.http_status_next(403, 1)   # a 403 with no expired-token code: denied at once
        with pytest.raises(AccessDeniedError, match="credential"):
            reader.read_file("a.bin")
        assert creds.issued == 2
        creds.lifetime = 60   # within the 5-minute margin: replaced before the next GET
        creds.expire_now()
        assert reader.read_file("a.bin") == b"payload" and creds.issued == 3
        assert reader.stats.retries == 0
        assert proxy.auth_seen == ["Bearer az-1", "Bearer az-1", "Bearer az-2", "Bearer az-2",
                                   "Bearer az-3"]


class _AzureTokens:
    """azure-identity's token credential interface (``get_token(scope)`` -> ``.token``,
    ``.expires_on``): each call issues a new token."""

    def __init__(self, lifetime: float) -> None:
        self.issued = 0
        self.lifetime = lifetime
        self._held = None

    def expire_now(self) -> None:
        if self._held is not None:
            self._held.expires_on = time.time() + self.lifetime

    def get_token(self, *scopes):
        self.issued += 1
        self._held = types.SimpleNamespace(token=f"az-{self.issued}",
                                           expires_on=time.time() + self.lifetime)
        return self._held


def test_abfs_urls_name_the_account_in_the_host(az_bucket):
    """adlfs's form, ``abfs://container@account.dfs.core.windows.net/path``, reads what
    ``az://container/path`` wrote: the account comes from the host, blobs from the Blob
    endpoint."""
    Storage(f"{az_bucket.url}/ds", storage_options=az_bucket.storage_options).write_atomic(
        "shards/a.bin", b"0123456789")
    so = {k: v for k, v in az_bucket.storage_options.items() if k != "account_name"}
    st = Storage(f"abfs://{az_bucket.name}@{ACCOUNT}.dfs.core.windows.net/ds",
                 storage_options=so)
    assert st.read_range("shards/a.bin", 2, 5) == b"234"
    assert st.listdir("shards") == ["shards/a.bin"]
    assert st.url("shards/a.bin").startswith(f"abfs://{az_bucket.name}@")




def test_inputs_on_the_store_are_refused_in_one_line(bucket, tmp_path):
    """gs:// and az:// hold datasets; convert's inputs come from local folders or s3://
    (zephon's own clients list no folders and open no streams): one line says so."""
    st = Storage(f"{bucket.url}/in", storage_options=bucket.storage_options)
    st.write_atomic("a.jsonl", b'{"id": 1, "text": "a"}\n')
    for src in (f"{bucket.url}/in/", f"{bucket.url}/in/a.jsonl"):
        with pytest.raises(InputError) as info:
            convert([src], str(tmp_path / "out"), input_storage_options=bucket.storage_options)
        assert "\n" not in str(info.value) and "copy the inputs" in str(info.value)
    assert not (tmp_path / "out").exists()
