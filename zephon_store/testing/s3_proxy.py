"""A counting, delaying and throttling HTTP/1.1 proxy in front of the S3 server.

It listens on one port per *label* (``CountingProxy(upstream_port, labels=8)``: label ``r`` is
rank ``r`` of a simulated node, and every process of that rank, its workers included, uses
``endpoint_url(r)``), so each request is known by the rank that sent it. For every request it
records the label, the S3 operation (``GET``, ``HEAD``, ``LIST``: a GET on a bucket with no
key, ``PUT``: PUT or POST, ``DELETE``), the object key, the body bytes sent back, the
status, and when the request arrived and when its answer was sent (so tests can count the
sequential round trips of a start: :func:`round_trips`). ``latency(s)`` delays every request by ``s`` before it is forwarded (a round trip
to a remote S3); ``throttle(rate)`` answers ``503 SlowDown`` (the S3 XML error) to any
request beyond ``rate`` per second (a token bucket holding at most ``rate`` tokens, or
``burst``, so a burst of that many requests passes at once and then ``rate`` per second), as
S3 does while a prefix is hit harder than it is partitioned for.

Stdlib asyncio in a daemon thread; the clients are other processes. Requests are parsed
(Content-Length and chunked bodies, keep-alive), so counts are per HTTP request, also on a
reused connection.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message><Resource>/</Resource>"
            b"<RequestId>startbench</RequestId></Error>")
OPS = ("GET", "HEAD", "LIST", "PUT", "DELETE", "OTHER")


@dataclass
class Request:
    t: float           # when the answer was sent: seconds since the proxy's clock was reset
    label: int
    op: str
    key: str           # "bucket/key" (a LIST: "bucket/?prefix")
    status: int
    nbytes: int        # response body bytes sent to the client
    span: tuple[int, int] | None   # the object byte range served (from Content-Range)
    start: float = 0.0   # when the request arrived (its head was read), on the same clock


def classify(method: str, target: str) -> tuple[str, str]:
    """(operation, "bucket/key") of a request line's method and target: S3's REST paths,
    or GCS's JSON API (``/storage/v1/b/B/o/KEY?alt=media`` a GET, without ``alt=media`` the
    metadata a HEAD is on S3, ``/storage/v1/b/B/o?prefix=`` a LIST, ``/upload/...`` a PUT),
    or Azure Blob's (``/account/container/blob``; ``?comp=list`` a LIST).

    >>> classify("GET", "/storage/v1/b/bk/o/ds%2Fmanifest.json?alt=media")
    ('GET', 'bk/ds/manifest.json')
    """
    parts = urlsplit(target)
    gcs = re.match(r"^/(upload/)?storage/v1/b/([^/]+)/o(?:/(.*))?$", parts.path)
    if gcs:
        return _classify_gcs(method, gcs, parts.query)
    path = unquote(parts.path).lstrip("/")
    bucket, _, key = path.partition("/")
    if method == "GET" and "comp=list" in parts.query:   # Azure Blob's listing
        q = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
        return "LIST", f"{path}/?{unquote(q.get('prefix', ''))}"
    if method in ("PUT", "POST"):
        return "PUT", path
    if method == "DELETE":
        return "DELETE", path
    if method == "HEAD":
        return "HEAD", path
    if method == "GET":
        if not key:
            q = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
            return "LIST", f"{bucket}/?{unquote(q.get('prefix', ''))}"
        return "GET", path
    return "OTHER", path


def _classify_gcs(method: str, match: re.Match, query: str) -> tuple[str, str]:
    q = dict(p.partition("=")[::2] for p in query.split("&") if p)
    upload, bucket, key = match.group(1), unquote(match.group(2)), unquote(match.group(3) or "")
    if upload or method in ("PUT", "POST"):
        return "PUT", f"{bucket}/{key or unquote(q.get('name', ''))}"
    if method == "DELETE":
        return "DELETE", f"{bucket}/{key}"
    if method == "GET" and not key:
        return "LIST", f"{bucket}/?{unquote(q.get('prefix', ''))}"
    if method == "GET":
        return ("GET" if q.get("alt") == "media" else "HEAD"), f"{bucket}/{key}"
    return "OTHER", f"{bucket}/{key}"


def _span(headers: dict[str, str], nbytes: int) -> tuple[int, int] | None:
    cr = headers.get("content-range", "")
    if cr.startswith("bytes ") and "-" in cr:
        lo, _, rest = cr[6:].partition("-")
        hi = rest.partition("/")[0]
        try:
            return int(lo), int(hi) + 1
        except ValueError:
            return None
    return (0, nbytes) if nbytes else None


async def _head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]] | None:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        return None
    lines = raw[:-4].decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _encode(first: str, headers: list[tuple[str, str]], drop: tuple[str, ...] = ()) -> bytes:
    kept = [f"{k}: {v}" for k, v in headers if k.lower() not in drop]
    return ("\r\n".join([first, *kept]) + "\r\n\r\n").encode("latin-1")


async def _body(reader: asyncio.StreamReader, headers: dict[str, str], *,
                request: bool = False) -> tuple[bytes, int, bool]:
    """(raw body with its framing, payload bytes, whether the connection may be kept); a
    request without Content-Length or chunked framing has no body."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, n = bytearray(), 0
        while True:
            line = await reader.readuntil(b"\r\n")
            out += line
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                while True:
                    trailer = await reader.readuntil(b"\r\n")
                    out += trailer
                    if trailer == b"\r\n":
                        return bytes(out), n, True
            out += await reader.readexactly(size + 2)
            n += size
    if "content-length" in headers:
        data = await reader.readexactly(int(headers["content-length"] or 0))
        return data, len(data), True
    if request:
        return b"", 0, True
    data = await reader.read()
    return data, len(data), False


class CountingProxy:
    """``127.0.0.1:<port per label>`` -> ``upstream``; see the module docstring."""

    def __init__(self, upstream_port: int, labels: int = 1, upstream_host: str = "127.0.0.1"):
        self.upstream = (upstream_host, upstream_port)
        self.ports: list[int] = []
        self.requests: list[Request] = []
        self._latency = 0.0
        self._rate = 0.0
        self._burst = 0.0
        self._tokens = 0.0
        self._stamp = 0.0
        self._t0 = time.monotonic()
        self._lock = threading.Lock()
        self._open: dict[int, tuple[float, int, str, str]] = {}   # in flight, by id
        self._ids = 0
        self._servers: list[asyncio.AbstractServer] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="countingproxy",
                                        daemon=True)
        self._thread.start()
        for label in range(labels):
            asyncio.run_coroutine_threadsafe(self._listen(label), self._loop).result(10)

    def endpoint_url(self, label: int = 0) -> str:
        return f"http://127.0.0.1:{self.ports[label]}"

    # -- control ------------------------------------------------------------------------------

    def latency(self, seconds: float) -> None:
        """Delay every request by ``seconds`` before forwarding it (0: none)."""
        self._latency = float(seconds)

    def throttle(self, rate: float, *, burst: float | None = None) -> None:
        """Answer 503 SlowDown above ``rate`` requests per second (0: never); ``burst``: the
        most requests that pass at once after a quiet spell (default ``rate``; 1 spaces every
        request ``1/rate`` apart, the harshest store of that rate)."""
        if burst is not None and burst < 1:
            raise ValueError(f"burst must be >= 1 request (or None: the rate), got {burst}")
        with self._lock:
            self._rate = float(rate)
            self._burst = float(rate if burst is None else burst)
            self._tokens = self._burst
            self._stamp = time.monotonic()

    def reset(self) -> list[Request]:
        """Clear the request log and restart its clock; returns the old log."""
        with self._lock:
            old, self.requests = self.requests, []
            self._t0 = time.monotonic()
            self._tokens, self._stamp = self._burst, time.monotonic()
        return old

    def clock(self, at: float | None = None) -> float:
        """``time.monotonic()`` value ``at`` (default: now; the clock is the machine's, so
        another process's reading works) in seconds on the request log's clock."""
        return (time.monotonic() if at is None else at) - self._t0

    def snapshot(self) -> list[Request]:
        with self._lock:
            return list(self.requests)

    def in_flight(self) -> list[tuple[float, int, str, str]]:
        """Requests that arrived and are not answered yet: ``(start, label, op, key)`` each
        (e.g. held by :meth:`latency`)."""
        with self._lock:
            return [(round(t - self._t0, 4), label, *classify(method, target))
                    for t, label, method, target in self._open.values()]

    def close(self) -> None:
        async def stop():
            for s in self._servers:
                s.close()
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- loop side ----------------------------------------------------------------------------

    async def _listen(self, label: int) -> None:
        async def handle(r, w):
            try:
                await self._handle(label, r, w)
            except asyncio.CancelledError:   # close()
                pass
        server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=1 << 20)
        self._servers.append(server)
        self.ports.append(server.sockets[0].getsockname()[1])

    def _admit(self) -> bool:
        with self._lock:
            if not self._rate:
                return True
            now = time.monotonic()
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False

    def _begin(self, label: int, method: str, target: str) -> int:
        with self._lock:
            self._ids += 1
            self._open[self._ids] = (time.monotonic(), label, method, target)
            return self._ids

    def _record(self, rid, label, method, target, status, nbytes, span) -> None:
        op, key = classify(method, target)
        with self._lock:
            start = self._open.pop(rid, (self._t0,))[0] - self._t0
            self.requests.append(Request(round(time.monotonic() - self._t0, 4), label, op, key,
                                         status, nbytes, span, round(max(0.0, start), 4)))

    async def _handle(self, label: int, creader, cwriter) -> None:
        up = rid = None
        try:
            while True:
                got = await _head(creader)
                if got is None:
                    return
                first, headers = got
                hmap = {k.lower(): v for k, v in headers}
                method, target = (first.split(" ") + ["", ""])[:2]
                rid = self._begin(label, method, target)
                if hmap.get("expect", "").lower() == "100-continue":
                    cwriter.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await cwriter.drain()
                body, _, _ = await _body(creader, hmap, request=True)
                if self._latency:
                    await asyncio.sleep(self._latency)
                if not self._admit():
                    payload = b"" if method == "HEAD" else SLOWDOWN
                    # Recorded before the client can have the answer: a test that looks
                    # right after its read returns must find the request counted.
                    self._record(rid, label, method, target, 503, len(payload), None)
                    cwriter.write(b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
                                  b"Content-Length: %d\r\n\r\n" % len(SLOWDOWN) + payload)
                    await cwriter.drain()
                    continue
                request = _encode(first, headers, drop=("expect",)) + body
                for _ in range(2):   # a reused upstream connection may have closed idle
                    if up is None:
                        up = await asyncio.open_connection(*self.upstream, limit=1 << 20)
                    up[1].write(request)
                    await up[1].drain()
                    resp = await _head(up[0])
                    if resp is not None:
                        break
                    up[1].transport.abort()
                    up = None
                else:
                    return
                rfirst, rheaders = resp
                rmap = {k.lower(): v for k, v in rheaders}
                status = int(rfirst.split(" ")[1])
                if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
                    raw, n, keep = b"", 0, True
                else:
                    raw, n, keep = await _body(up[0], rmap)
                self._record(rid, label, method, target, status, n,   # before: see the 503 above
                             _span(rmap, n) if status in (200, 206) and method == "GET" else None)
                cwriter.write(_encode(rfirst, rheaders) + raw)
                await cwriter.drain()
                if not keep:
                    up[1].transport.abort()
                    up = None
                    cwriter.close()
                    return
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            if rid is not None:   # a request left unanswered (a connection that broke)
                with self._lock:
                    self._open.pop(rid, None)
            if up is not None:
                up[1].transport.abort()
            if not cwriter.transport.is_closing():
                cwriter.close()


def round_trips(reqs: list[Request], *, until: float | None = None) -> list[Request]:
    """The longest chain of ``reqs`` each of which arrived after the one before it was
    answered: the sequential round trips a client waited for, whatever ran in parallel.

    ``until``: only requests answered by then (e.g. when the first batch was handed over) are
    counted. With a :meth:`CountingProxy.latency` well above the scheduling noise, requests a
    client sends together never chain by accident.

    >>> a, b, c = (Request(t, 0, "GET", k, 200, 1, None, s)
    ...            for s, t, k in ((0.0, 0.1, "m"), (0.11, 0.2, "t"), (0.12, 0.21, "u")))
    >>> [r.key for r in round_trips([a, b, c])]
    ['m', 't']
    """
    done = sorted((r for r in reqs if until is None or r.t <= until), key=lambda r: r.t)
    best: list[list[Request]] = []
    for i, r in enumerate(done):
        before = [best[j] for j in range(i) if done[j].t <= r.start]
        best.append([*max(before, key=len, default=[]), r])
    return max(best, key=len, default=[])


def summarize(reqs: list[Request]) -> dict:
    """Counts per operation, 503s, body bytes, and bytes fetched more than once.

    ``dup_bytes``: GET bytes beyond the union of the byte ranges served per object (the same
    bytes fetched again, by another rank, worker or a retry).
    """
    ops = dict.fromkeys(OPS, 0)
    spans: dict[str, list[tuple[int, int]]] = {}
    total = 0
    for r in reqs:
        if r.status == 503:
            continue
        ops[r.op] += 1
        total += r.nbytes
        if r.span is not None:
            spans.setdefault(r.key, []).append(r.span)
    unique = 0
    for ivs in spans.values():
        ivs.sort()
        lo, hi = ivs[0]
        for a, b in ivs[1:]:
            if a > hi:
                unique += hi - lo
                lo, hi = a, b
            else:
                hi = max(hi, b)
        unique += hi - lo
    get_bytes = sum(r.nbytes for r in reqs if r.op == "GET" and r.status in (200, 206))
    return {"requests": sum(ops.values()), **{k.lower(): v for k, v in ops.items() if v},
            "throttled_503": sum(1 for r in reqs if r.status == 503),
            "errors": sum(1 for r in reqs if r.status >= 400 and r.status != 503),
            "bytes": total, "dup_bytes": max(0, get_bytes - unique)}
