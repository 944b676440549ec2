"""A run keeps reading across credential rotations (issue 44): SeaweedFS with three
identities; the first revoked between the loader's plan and its GETs, the second mid-run.

The credentials come from the provider chain (a shared credentials file, as a rotating
agent or a credential process leaves them), never from the storage options. A GET that S3
refuses for a key that was good once (``InvalidAccessKeyId``, ``ExpiredToken``...) makes the
read client resolve the chain again and send that GET once more; the run loses nothing.
The server is this module's own: revoking an identity on the session's server would touch
every other test.
"""

from __future__ import annotations

import hashlib

import pytest

from tests.integration import test_s3_loader as s3_tests
from zephon_store import (
    BatchOptions,
    ReadAheadOptions,
    StopOptions,
    Topology,
    WorkerOptions,
    convert,
    open_dataset,
)
from zephon_store.errors import AccessDeniedError
from zephon_store.io import storage as storage_mod
from zephon_store.testing.s3_server import SeaweedServer

pytestmark = pytest.mark.integration
pytest.importorskip("torch")
from zephon_store.torch import ZephonLoader  # noqa: E402

B = 16
# The S3 end-to-end tests' corpus (a module fixture) and helpers: the same data.
corpus = s3_tests.corpus
OPTS, ORDER, _open = s3_tests.OPTS, s3_tests.ORDER, s3_tests._open


@pytest.fixture(scope="module")
def server():
    with SeaweedServer(key="zephon-admin", secret="zephon-admin-secret") as srv:
        for user in ("a", "b", "c", "w1", "w2"):
            actions = "Read,Write,List" if user.startswith("w") else "Read,List"
            srv.shell(f"s3.configure -user={user} -access_key=key-{user} "
                      f"-secret_key=secret-{user} -actions={actions} -apply")
        yield srv


@pytest.fixture
def credentials_file(tmp_path, monkeypatch):
    """The chain's shared credentials file, holding identity ``a``; ``write(user)`` rotates
    it. Nothing else in the environment names credentials."""
    path = tmp_path / "credentials"

    def write(user: str) -> None:
        path.write_text(f"[default]\naws_access_key_id = key-{user}\n"
                        f"aws_secret_access_key = secret-{user}\n")

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    write("a")
    return write


def _loader(ds, steps):
    # No read-ahead to speak of, so that GETs are still to be sent after the rotation mid-run.
    return ZephonLoader(ds, topology=Topology(B, 1, 0), order=ORDER,
                        batch=BatchOptions(with_seq=True), stop=StopOptions(max_steps=steps),
                        workers=WorkerOptions(prefetch=2),
                        read_ahead=ReadAheadOptions(prefetch_bytes=1, decode_ahead_bytes=1))


def _drain(it, ids, digest, *, at=None, then=None):
    for step, batch in enumerate(it):
        ids.extend(batch["_seq"].tolist())
        for text in batch["text"]:
            digest.update(text.encode())
        if step == at:
            then()


def test_a_run_reads_on_across_a_revoked_identity(server, credentials_file, corpus, tmp_path):
    url = "s3://rotation/ds"
    admin = server.storage_options()
    storage_mod.Storage("s3://rotation", storage_options=admin).fs.mkdir("rotation")
    convert([str(corpus / "src")], url, options=OPTS, storage_options=admin)
    local = open_dataset(str(corpus / "local"))
    steps = local.num_samples // B
    want_ids, want = [], hashlib.sha256()
    _drain(iter(_loader(local, steps)), want_ids, want)

    chain = {"endpoint_url": server.endpoint_url,
             "config_kwargs": {"connect_timeout": 2, "read_timeout": 5}}
    ds = _open(url, chain, tmp_path)           # the manifest and index, read as ``a``
    it = iter(_loader(ds, steps))              # the prefetch plan, made as ``a``
    # ``a`` is rotated out between the plan and its GETs: the agent writes ``b``, the
    # store revokes ``a``.
    credentials_file("b")
    server.shell("s3.configure -user=a -access_key=key-a -delete -apply")
    client = storage_mod.lean_client(chain)

    def rotate_again() -> None:   # mid-run: ``b`` is rotated out for ``c``
        assert client.refreshes == 1 and client.credentials.access_key == "key-b"
        rotated_at.append(ds.storage.stats.requests)
        credentials_file("c")
        server.shell("s3.configure -user=b -access_key=key-b -delete -apply")

    ids, digest, rotated_at = [], hashlib.sha256(), []
    _drain(it, ids, digest, at=steps // 3, then=rotate_again)
    assert (ids, digest.hexdigest()) == (want_ids, want.hexdigest())
    assert ds.storage.stats.requests > rotated_at[0]   # GETs were made after the rotation
    assert client.refreshes == 2 and client.credentials.access_key == "key-c"
    assert ds.storage.stats.retries == 0   # resent at once, not after a back-off


def test_writes_carry_on_across_a_revoked_identity(server, credentials_file):
    """The write path (s3fs: PUT, HEAD, LIST) makes a fresh client from the chain after a
    refusal of credentials that were good once, and sends the request once more."""
    admin = server.storage_options()
    storage_mod.Storage("s3://rotation-w", storage_options=admin).fs.mkdir("rotation-w")
    credentials_file("w1")
    st = storage_mod.Storage("s3://rotation-w/ds", storage_options={
        "endpoint_url": server.endpoint_url, "config_kwargs": {"read_timeout": 5}})
    st.write_atomic("one.bin", b"1")
    credentials_file("w2")
    server.shell("s3.configure -user=w1 -access_key=key-w1 -delete -apply")
    st.write_atomic("two.bin", b"2")
    assert st.size("two.bin") == 1 and st.listdir("") == ["one.bin", "two.bin"]
    assert st.stats.retries == 0


def test_a_wrong_key_in_the_options_is_denied_without_a_refresh(server, credentials_file):
    st = storage_mod.Storage("s3://rotation/none", storage_options={
        "endpoint_url": server.endpoint_url, "key": "key-gone", "secret": "s"})
    with pytest.raises(AccessDeniedError, match="check credentials"):
        st.read_file("manifest.json")
    assert st.stats.requests == 1
