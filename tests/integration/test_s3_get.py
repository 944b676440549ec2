"""zephon's own S3 GET client for the read path (zephon_store/io/s3_get.py): signatures a
real S3 server checks, the s3fs fallback, kept-alive connections and forks.

Most of its behaviour is proved by the S3 suites it now serves (test_storage_s3: retries,
faults, checksums, 403/404; test_s3_loader; test_throttle_s3); these are the cases only it
has.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import threading

import pytest

from tests.helpers import in_fork
from zephon_store.errors import StorageOptionsError
from zephon_store.io import s3_get
from zephon_store.io import storage as storage_mod
from zephon_store.io.storage import Storage

s3fs = pytest.importorskip("s3fs")


@pytest.fixture(autouse=True)
def _fresh_clients(monkeypatch):
    monkeypatch.setattr(storage_mod, "_LEAN", {})


@pytest.mark.parametrize("prefix", ["plain/ds", "a b/ds+1", "é/ds=x~y", "deep/er/ds!(1)"])
def test_signed_gets_of_odd_keys_are_accepted_by_a_checking_server(s3_bucket, prefix):
    """SeaweedFS checks SigV4 (its key variables are set): a key with spaces, '+', '=', '~',
    unicode or brackets must be quoted and signed as S3 expects, whole and ranged."""
    fs = s3fs.S3FileSystem(**s3_bucket.storage_options, skip_instance_cache=True)
    data = bytes(range(256)) * 40
    fs.pipe_file(f"{s3_bucket.name}/{prefix}/shards/x y+z.bin", data)
    st = Storage(f"{s3_bucket.url}/{prefix}", storage_options=s3_bucket.storage_options)
    assert st._lean() is not None   # this test is about the lean client
    assert st.read_file("shards/x y+z.bin") == data
    assert st.read_range("shards/x y+z.bin", 1000, 1500) == data[1000:1500]
    assert (st.stats.requests, st.stats.retries) == (2, 0)


def test_a_wrong_secret_and_a_missing_key_are_told_apart(s3_bucket):
    from zephon_store.errors import AccessDeniedError, ShardNotFoundError

    good = Storage(f"{s3_bucket.url}/ds", storage_options=s3_bucket.storage_options)
    with pytest.raises(ShardNotFoundError):
        good.read_file("absent.json")
    bad = Storage(f"{s3_bucket.url}/ds",
                  storage_options={**s3_bucket.storage_options, "secret": "wrong"})
    with pytest.raises(AccessDeniedError):
        bad.read_file("absent.json")


def test_the_s3fs_path_is_one_option_away(s3_bucket):
    opts = {**s3_bucket.storage_options, "s3_client": "s3fs"}
    st = Storage(f"{s3_bucket.url}/ds", storage_options=opts)
    assert st._lean() is None
    with pytest.raises(StorageOptionsError, match="s3_client"):
        Storage(f"{s3_bucket.url}/ds",
                storage_options={**opts, "s3_client": "boto"}).read_file("x")


@pytest.mark.parametrize("options, lean", [
    ({"key": "k", "secret": "s", "endpoint_url": "http://h:1"}, True),
    ({"profile": "p", "client_kwargs": {"region_name": "eu-west-1"}}, True),
    ({"config_kwargs": {"s3": {"addressing_style": "path"}, "read_timeout": 3}}, True),
    ({"requester_pays": True}, False),
    ({"s3_additional_kwargs": {"SSECustomerKey": "x"}}, False),
    ({"config_kwargs": {"proxies": {"https": "http://p:3128"}}}, False),
    ({"client_kwargs": {"use_ssl": False}}, False),
    ({"s3_client": "s3fs"}, False),
])
def test_which_options_the_get_client_serves(options, lean):
    assert s3_get.lean_options(options) is lean


def test_a_proxy_in_the_environment_keeps_s3fs(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert not s3_get.lean_options({"key": "k", "secret": "s"})


# -- against a scripted server: what SeaweedFS does not do ----------------------------------


class _Scripted(http.server.BaseHTTPRequestHandler):
    """Answers GETs from ``server.objects``; ``server.region`` is the bucket's region: a
    request signed for another gets S3's AuthorizationHeaderMalformed naming it.
    ``server.drop_after_reply``: close each connection after its reply while still
    announcing keep-alive (an idle connection the server dropped)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:   # noqa: N802 - http.server's name
        srv = self.server
        srv.seen.append((self.path, self.headers.get("Authorization", ""),
                         self.client_address[1]))
        scope = re.search(r"Credential=[^/]+/\d+/([a-z0-9-]+)/s3/", self.headers.get(
            "Authorization", ""))
        if scope and scope.group(1) != srv.region:
            body = (f"<Error><Code>AuthorizationHeaderMalformed</Code><Message>the region "
                    f"'{scope.group(1)}' is wrong; expecting '{srv.region}'</Message>"
                    f"<Region>{srv.region}</Region></Error>").encode()
            self._reply(400, body)
            return
        data = srv.objects.get(self.path.split("?")[0])
        if data is None:
            self._reply(404, b"<Error><Code>NoSuchKey</Code><Message>no</Message></Error>")
            return
        self._reply(200, data)
        if srv.drop_after_reply:
            self.close_connection = True

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextlib.contextmanager
def _scripted(objects: dict[str, bytes], *, region: str = "us-east-1",
              drop_after_reply: bool = False):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    srv.objects, srv.region, srv.seen = objects, region, []
    srv.drop_after_reply = drop_after_reply
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_bucket_in_another_region_falls_back_to_s3fs():
    """Signed for the configured region, S3 names the bucket's own: the read is served by
    s3fs (botocore follows the hint) and this process reads through s3fs from then on."""
    with _scripted({"/b/ds/manifest.json": b"{}"}, region="eu-west-2") as (srv, url):
        opts = {"key": "k", "secret": "s", "endpoint_url": url,
                "client_kwargs": {"region_name": "us-east-1"}}
        st = Storage("s3://b/ds", storage_options=opts)
        assert st._lean() is not None
        assert st.read_file("manifest.json") == b"{}"
        assert storage_mod.lean_client(opts) is None
        assert "/us-east-1/" in srv.seen[0][1] and "/eu-west-2/" in srv.seen[-1][1]


def test_a_connection_the_server_dropped_is_replaced_without_a_retry():
    with _scripted({"/b/ds/a": b"x" * 100}, drop_after_reply=True) as (srv, url):
        st = Storage("s3://b/ds", storage_options={"key": "k", "secret": "s",
                                                   "endpoint_url": url})
        for _ in range(3):
            assert st.read_file("a") == b"x" * 100
        assert (st.stats.requests, st.stats.retries) == (3, 0)
        assert len(srv.seen) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_uses_its_parent_s_connection():
    with _scripted({"/b/ds/a": b"parent", "/b/ds/c": b"child"}) as (srv, url):
        opts = {"key": "k", "secret": "s", "endpoint_url": url}
        st = Storage("s3://b/ds", storage_options=opts)
        assert st.read_file("a") == b"parent"   # its connection now idle in the pool
        idle = next(iter(storage_mod.lean_client(opts).pool._idle.values()))[0]
        assert in_fork(lambda: st.read_file("c")) == str(b"child")
        ports = {path: port for path, _, port in srv.seen}
        assert ports["/b/ds/c"] != ports["/b/ds/a"]   # the child opened its own connection
        assert st.read_file("a") == b"parent"   # the parent's connection still works
        assert idle in sum(storage_mod.lean_client(opts).pool._idle.values(), [])


def test_the_region_comes_from_the_options_the_environment_or_the_config_file(
        tmp_path, monkeypatch):
    opts = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"}
    for name in ("AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "absent"))

    def no_session(_opts):
        raise AssertionError("no botocore session needed: keys given, no config file")

    monkeypatch.setattr(s3_get, "_session", no_session)
    assert s3_get.from_options(opts).region == "us-east-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert s3_get.from_options(opts).region == "ap-south-1"
    assert s3_get.from_options({**opts, "client_kwargs": {"region_name": "eu-north-1"}}
                               ).region == "eu-north-1"
    monkeypatch.undo()
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    (tmp_path / "config").write_text("[default]\nregion = eu-west-3\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    assert s3_get.from_options(opts).region == "eu-west-3"
    # An AWS endpoint with no region anywhere: s3fs, which follows S3's redirects.
    (tmp_path / "config").write_text("[default]\n")
    assert s3_get.from_options({"key": "k", "secret": "s"}) is None
