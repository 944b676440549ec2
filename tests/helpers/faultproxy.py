"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1 for retry tests (no toxiproxy here).

It parses requests and responses (Content-Length and chunked framing, keep-alive), so faults
and counters are **per HTTP request**, also when s3fs reuses a connection. Each ``*_next(n)``
appends ``n`` faults to one FIFO queue; every request through the proxy (GET, HEAD, PUT...)
takes the next queued fault, if any (a fault queued with ``path=`` waits for a request whose
target contains that text).

Usage (the tests in tests/integration show it against a real SeaweedFS)::

    proxy = FaultProxy(upstream_port=8333)
    proxy.reset_next(2)            # the next two requests get a connection reset
    fs = s3fs.S3FileSystem(endpoint_url=proxy.endpoint_url, ...)
    proxy.requests, proxy.injected # (3, 2) after one GET that was retried twice

Faults: ``reset_next``, ``http503_next``, ``http_status_next`` (any status, JSON body), ``truncate_next``, ``corrupt_next`` (a flipped body
byte), ``bad_checksum_next`` (a wrong S3 checksum header), ``blackhole_next``, ``latency``,
``down``/``down_forever``/``up``.

Disk faults for cache tests: :func:`read_only_folder`, :func:`cache_disk_full` (a real ENOSPC
from ``/dev/full``) and :func:`cache_folder_vanishes` (the folder removed mid-write), both
built on :func:`cache_after_mkstemp`.

Counters: ``connections`` (accepted client connections), ``requests`` (parsed requests,
faulted ones included), ``bytes_down`` (response *body* bytes sent to clients, the 503 XML
included, headers excluded), ``injected`` (faults fired). ``log`` holds ``(method, target,
fault)`` per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import subprocess
import tempfile
import threading
import types
from collections import deque

_SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><Resource>/</Resource>"
    b"<RequestId>faultproxy</RequestId></Error>"
)

# The CRC32 of no body this proxy relays in tests (base64 of 4 bytes, as S3 sends it).
_WRONG_CRC32 = "3q2+7w=="


class _Head:
    """A parsed request or response head."""

    def __init__(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        self.first = lines[0]
        self.headers: list[tuple[str, str]] = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                self.headers.append((name.strip(), value.strip()))

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def encode(self, *, drop: tuple[str, ...] = ()) -> bytes:
        kept = [f"{k}: {v}" for k, v in self.headers if k.lower() not in drop]
        return ("\r\n".join([self.first, *kept]) + "\r\n\r\n").encode("latin-1")


async def _read_head(reader: asyncio.StreamReader) -> _Head | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    return _Head(raw[:-4])


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    """The raw chunked body, framing included, up to and including the final CRLF."""
    out = bytearray()
    while True:
        line = await reader.readuntil(b"\r\n")
        out += line
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, then an empty line
                trailer = await reader.readuntil(b"\r\n")
                out += trailer
                if trailer == b"\r\n":
                    return bytes(out)
        out += await reader.readexactly(size + 2)


class FaultProxy:
    """Proxy ``127.0.0.1:<ephemeral>`` -> ``upstream_host:upstream_port`` with faults.

    Runs its own asyncio loop in a daemon thread; :meth:`close` stops it.
    """

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.connections = 0
        self.requests = 0
        self.bytes_down = 0
        self.injected = 0
        self.log: list[tuple[str, str, str | None]] = []
        self.auth_seen: list[str | None] = []   # each request's Authorization header
        self._faults: deque[tuple[str, int, str | None]] = deque()
        self._latency = 0.0
        self._lock = threading.Lock()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.AbstractServer | None = None
        self._reopen: asyncio.TimerHandle | None = None
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy",
                                        daemon=True)
        self._thread.start()
        self._call(self._listen())

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control (any thread) ---------------------------------------------------------------

    def _call(self, coro):  # run a coroutine on the proxy loop and wait for it
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def _queue(self, kind: str, n: int, arg: int = 0, path: str | None = None) -> None:
        with self._lock:
            self._faults.extend([(kind, arg, path)] * n)

    def reset_next(self, n: int = 1) -> None:
        """Answer the next ``n`` requests with a TCP reset."""
        self._queue("reset", n)

    def http_status_next(self, status: int, n: int = 1) -> None:
        """Answer the next ``n`` requests with HTTP ``status`` and a JSON error body (GCS's
        shape; e.g. 429, 401, 403)."""
        self._queue("status", n, status)

    def http503_next(self, n: int = 1) -> None:
        """Answer the next ``n`` requests with ``503 SlowDown`` (S3 XML error body)."""
        self._queue("503", n)

    def truncate_next(self, n: int = 1, nbytes: int = 100) -> None:
        """Send headers and at most ``nbytes`` of the body (always short), then close."""
        self._queue("truncate", n, nbytes)

    def corrupt_next(self, n: int = 1, offset: int = 0, *, path: str | None = None) -> None:
        """Relay the next ``n`` responses with one body byte flipped (at ``offset``, clamped to
        the body), framing and headers unchanged: a whole-object GET then fails the S3
        checksum header (botocore ``FlexibleChecksumError``), a ranged GET its xxh3. With
        ``path``, only requests whose target contains it take these faults."""
        self._queue("corrupt", n, offset, path)

    def bad_checksum_next(self, n: int = 1, *, path: str | None = None) -> None:
        """Relay the next ``n`` responses with a wrong ``x-amz-checksum-crc32`` header (the
        body intact): botocore rejects a whole-object GET whose body does not match it.
        ``path`` as for :meth:`corrupt_next`."""
        self._queue("bad_checksum", n, 0, path)

    def blackhole_next(self, n: int = 1) -> None:
        """Read the next ``n`` requests and never answer (the client must time out)."""
        self._queue("blackhole", n)

    def latency(self, seconds: float) -> None:
        """Delay every request by ``seconds`` before forwarding it (0 turns it off)."""
        self._latency = float(seconds)

    def clear_faults(self) -> None:
        """Drop queued faults and latency (counters stay)."""
        with self._lock:
            self._faults.clear()
        self._latency = 0.0

    def reset_counters(self) -> None:
        self.connections = self.requests = self.bytes_down = self.injected = 0
        self.log.clear()
        self.auth_seen.clear()

    def down(self, seconds: float) -> None:
        """Drop every connection and refuse new ones for ``seconds`` (nothing listens)."""
        self._call(self._go_down(seconds))

    def down_forever(self) -> None:
        """Like :meth:`down` until :meth:`up` or :meth:`close`."""
        self._call(self._go_down(None))

    def up(self) -> None:
        """Listen again (same port) after :meth:`down`."""
        self._call(self._listen())

    def close(self) -> None:
        """Stop listening, drop connections and stop the thread."""
        if not self._thread.is_alive():
            return
        self._call(self._go_down(None))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- loop side --------------------------------------------------------------------------

    async def _listen(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self._server is not None:
            return
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True, limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _go_down(self, seconds: float | None) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if seconds is not None:
            self._reopen = self._loop.call_later(
                seconds, lambda: self._loop.create_task(self._listen()))

    def _next_fault(self, target: str) -> tuple[str, int] | None:
        """The first queued fault for ``target`` (one queued with a ``path`` only matches
        targets that contain it), removed from the queue."""
        with self._lock:
            for i, (kind, arg, path) in enumerate(self._faults):
                if path is None or path in target:
                    del self._faults[i]
                    return kind, arg
            return None

    async def _handle(self, creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(cwriter)
        up: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while True:
                head = await _read_head(creader)
                if head is None:
                    return
                method, target = (head.first.split(" ") + ["", ""])[:2]
                body = b""
                if (head.get("Expect") or "").lower() == "100-continue":
                    cwriter.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await cwriter.drain()
                if (head.get("Transfer-Encoding") or "").lower() == "chunked":
                    body = await _read_chunked(creader)
                elif head.get("Content-Length"):
                    body = await creader.readexactly(int(head.get("Content-Length") or 0))
                self.requests += 1
                self.auth_seen.append(head.get("Authorization"))
                fault = self._next_fault(target)
                self.log.append((method, target, fault[0] if fault else None))
                if fault is not None:
                    self.injected += 1
                if self._latency:
                    await asyncio.sleep(self._latency)
                kind = fault[0] if fault else None
                if kind == "reset":
                    sock = cwriter.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    cwriter.transport.abort()
                    return
                if kind == "blackhole":
                    with contextlib.suppress(ConnectionError):
                        await creader.read()  # until the client gives up and closes
                    return
                if kind == "503":
                    payload = b"" if method == "HEAD" else _SLOWDOWN_BODY
                    self.bytes_down += len(payload)
                    cwriter.write(
                        b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                        b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n"
                        % len(_SLOWDOWN_BODY) + payload)
                    await cwriter.drain()
                    continue
                if kind == "status":
                    error = b'{"error": {"code": %d, "message": "faultproxy"}}' % fault[1]
                    self.bytes_down += len(error)
                    cwriter.write(b"HTTP/1.1 %d Fault\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nConnection: keep-alive\r\n\r\n"
                                  % (fault[1], len(error)) + (b"" if method == "HEAD" else error))
                    await cwriter.drain()
                    continue
                # 'expect' is not signed by SigV4; we already answered 100 ourselves.
                request = head.encode(drop=("expect",)) + body
                keep = None
                for _ in range(2):  # a reused upstream connection may have timed out idle
                    if up is None:
                        up = await asyncio.open_connection(*self.upstream, limit=1 << 20)
                        self._writers.add(up[1])
                    up[1].write(request)
                    await up[1].drain()
                    keep = await self._relay(up[0], cwriter, method, fault)
                    if keep is not None:
                        break
                    self._writers.discard(up[1])
                    up[1].transport.abort()
                    up = None
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            self._writers.discard(cwriter)
            if up is not None:
                self._writers.discard(up[1])
                up[1].transport.abort()
            if not cwriter.transport.is_closing():
                cwriter.close()

    async def _relay(self, ureader: asyncio.StreamReader, cwriter: asyncio.StreamWriter,
                     method: str, fault: tuple[str, int] | None) -> bool | None:
        """Relay one response (applying a body or header ``fault``); False when the connection
        must end, None when upstream closed before answering (nothing was sent to the client)."""
        head = await _read_head(ureader)
        if head is None:
            return None
        kind, arg = fault if fault is not None else (None, 0)
        status = int(head.first.split(" ")[1])
        if kind == "bad_checksum":
            head.headers = [(k, v) for k, v in head.headers if k.lower() != "x-amz-checksum-crc32"]
            head.headers.append(("x-amz-checksum-crc32", _WRONG_CRC32))
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            cwriter.write(head.encode())
            await cwriter.drain()
            return True
        if (head.get("Transfer-Encoding") or "").lower() == "chunked":
            body = await _read_chunked(ureader)
            keep = True
        elif head.get("Content-Length") is not None:
            body = await ureader.readexactly(int(head.get("Content-Length") or 0))
            keep = True
        else:
            body = await ureader.read()
            keep = False
        if kind == "truncate":
            body = body[:max(0, min(arg, len(body) - 1))]
            keep = False
        elif kind == "corrupt" and body and status in (200, 206):
            i = min(arg, len(body) - 1)
            body = body[:i] + bytes([body[i] ^ 0x01]) + body[i + 1:]
        self.bytes_down += len(body)  # before write(): the client may see the bytes at once
        cwriter.write(head.encode() + body)
        await cwriter.drain()
        if not keep:
            cwriter.close()
        return keep


# -- disk faults ------------------------------------------------------------------------------

def _skip(reason: str) -> None:
    import pytest

    pytest.skip(reason)


@contextlib.contextmanager
def read_only_folder(directory):
    """``directory`` made read-only for this process: mode 0555, or (root ignores modes) a
    read-only bind mount of it onto itself; skips the test when neither is possible."""
    d = str(directory)
    if os.geteuid() != 0:
        os.chmod(d, 0o555)
        try:
            yield
        finally:
            os.chmod(d, 0o755)
        return
    if subprocess.run(["mount", "--bind", d, d], capture_output=True).returncode != 0:
        _skip("running as root without mount(8) rights: no way to make a folder read-only")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", d, d],
                          capture_output=True).returncode != 0:
            _skip("cannot remount the bind mount read-only")
        yield
    finally:
        subprocess.run(["umount", d], check=True)


def cache_after_mkstemp(monkeypatch, then) -> None:
    """Run ``then(fd) -> fd`` on every temp file :mod:`zephon_store.io.cache` makes, right after
    it is made (``monkeypatch``: pytest's fixture)."""
    real = tempfile.mkstemp

    def mkstemp(*args, **kw):
        fd, path = real(*args, **kw)
        return then(fd), path

    monkeypatch.setattr("zephon_store.io.cache.tempfile", types.SimpleNamespace(mkstemp=mkstemp))


def cache_disk_full(monkeypatch) -> None:
    """Every temp file :mod:`zephon_store.io.cache` writes fails with a real ENOSPC (its fd is
    swapped for ``/dev/full``), as on a full filesystem; skips where there is no /dev/full."""
    if not os.path.exists("/dev/full"):
        _skip("no /dev/full to give a real ENOSPC")

    def full(fd: int) -> int:
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY)

    cache_after_mkstemp(monkeypatch, full)


def cache_folder_vanishes(monkeypatch, directory) -> None:
    """``directory`` (a cache folder) is removed, as by a cleanup job, each time
    :mod:`zephon_store.io.cache` has made a temp file in it and before it publishes that."""
    import shutil

    def remove(fd: int) -> int:
        shutil.rmtree(directory, ignore_errors=True)   # other threads may be adding files
        return fd

    cache_after_mkstemp(monkeypatch, remove)
