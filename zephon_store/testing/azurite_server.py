"""A real Azure Blob server on 127.0.0.1 for tests: Azurite (npm), in memory.

``make test`` installs it into the repo's ignored ``.azurite/`` folder (``npm install --prefix
.azurite azurite``); :func:`find_azurite` looks there, then at ``$ZEPHON_AZURITE`` (the
``azurite-blob`` script), then on ``PATH``. It checks Shared Key signatures with the
well-known development account, honours ``If-None-Match: *`` and ``If-Match`` on uploads and
deletes, and serves ranged GETs. Its OAuth mode needs HTTPS and is not used: tokens that
expire are tested through the fault proxy (docs/storage.md).

>>> with AzuriteServer() as server:   # doctest: +SKIP
...     server.create_container("data")
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from .loopback_server import LoopbackServer

ACCOUNT = "devstoreaccount1"
# Azurite's documented development key (public, the same in every Azurite).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def find_azurite() -> str | None:
    """The ``azurite-blob`` script: the repo's ``.azurite/``, ``$ZEPHON_AZURITE``, or PATH."""
    for path in (os.path.join(_REPO, ".azurite", "node_modules", ".bin", "azurite-blob"),
                 os.environ.get("ZEPHON_AZURITE") or ""):
        if path and os.access(path, os.X_OK):
            return path
    return shutil.which("azurite-blob")


class AzuriteServer(LoopbackServer):
    """One ``azurite-blob`` process (in memory, loopback, telemetry off) on a free port."""

    name = "Azurite"

    def __init__(self, *, binary: str | None = None, startup_timeout: float = 30.0) -> None:
        super().__init__(binary or find_azurite(), startup_timeout=startup_timeout)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{ACCOUNT}"

    def storage_options(self, endpoint_url: str | None = None, *,
                        read_timeout: float = 5, connect_timeout: float = 2) -> dict[str, Any]:
        """zephon storage options for this server (or a proxy in front of it: its
        ``http://127.0.0.1:PORT``)."""
        endpoint = f"{endpoint_url}/{ACCOUNT}" if endpoint_url else self.endpoint_url
        return {"account_name": ACCOUNT, "account_key": KEY, "endpoint_url": endpoint,
                "read_timeout": read_timeout, "connect_timeout": connect_timeout}

    def command(self, port: int) -> list[str]:
        return [self.binary, "--blobHost", "127.0.0.1", "--blobPort", str(port),
                "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck",
                "--loose", "--silent"]

    def ready(self) -> None:
        self.create_container("zephon-ready")

    def create_container(self, name: str, *, public: bool = False) -> None:
        """Create container ``name`` (signed with the development key); ``public``: anyone
        may read its blobs (``x-ms-blob-public-access: container``)."""
        from ..io.azure import AzureStore

        store = AzureStore(endpoint=self.endpoint_url, account=ACCOUNT, account_key=KEY,
                           connect_timeout=2, read_timeout=5)
        try:
            store._request("PUT", store._blob_path(name), query={"restype": "container"},
                           headers={"x-ms-blob-public-access": "container"} if public else {},
                           length=0, body=b"", ok=(201,))
        finally:
            store.close()


__all__ = ["ACCOUNT", "KEY", "AzuriteServer", "find_azurite"]
