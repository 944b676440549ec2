"""Kept-alive HTTP(S) connections for the read path's GET clients (S3, GCS).

One pool per client: each request takes an idle connection of its host (or opens one) and
gives it back when the answer was read whole. Safe to share between threads and across
``fork`` (a child never reuses its parent's sockets). Every pool of the process closes its
idle connections at exit, rather than leaving them to the garbage collector, which warns
about each unclosed socket.

>>> pool = ConnectionPool("http", connect_timeout=1, read_timeout=1)
>>> pool.close()
"""

from __future__ import annotations

import atexit
import http.client
import os
import ssl
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..observe import causes

# An idle connection that the server closed meanwhile fails with one of these before the
# request reaches it: sent again at once on a fresh connection, not counted as a retry.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class ConnectionPool:
    """Idle connections by host. ``scheme``: ``http`` or ``https``; ``verify``: TLS
    verification as botocore takes it (False: off, a path: the CA bundle, True: the
    system's CAs)."""

    def __init__(self, scheme: str, *, connect_timeout: float, read_timeout: float,
                 verify: Any = True) -> None:
        self.scheme = scheme
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        self._pid = os.getpid()
        _POOLS.add(self)

    def request(self, host: str, send: Callable[[http.client.HTTPConnection], None]
                ) -> tuple[http.client.HTTPResponse, bytes]:
        """``send(conn)`` (``conn.request(...)``) on a kept-alive connection to ``host``, then
        the response and its whole body. A kept-alive connection that turned out closed is
        replaced once, at once; every other error closes the connection and propagates."""
        for reused in self._attempts(host):
            conn = reused or self._connect(host)
            try:
                send(conn)
                resp = conn.getresponse()
            except _STALE:
                conn.close()
                if reused is None:
                    raise
                # Sent again at once, fresh: the store saw a request, which the storage
                # layer counts once (observe/causes.py: requests + reconnects).
                causes.count("reconnects")
                continue
            except BaseException:
                conn.close()
                raise
            try:
                body = resp.read()
            except BaseException:
                conn.close()
                raise
            self._release(host, conn, resp)
            return resp, body
        raise AssertionError("unreachable")  # pragma: no cover

    def _attempts(self, host: str):
        """Yield an idle kept-alive connection (or None for a fresh one), then None."""
        with self._lock:
            if self._pid != os.getpid():   # forked: the parent's sockets are not ours
                self._idle, self._pid = {}, os.getpid()
            idle = self._idle.get(host)
            conn = idle.pop() if idle else None
        yield conn
        if conn is not None:
            yield None

    def _connect(self, host: str) -> http.client.HTTPConnection:
        if self.scheme == "https":
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, timeout=self.connect_timeout, context=self._ssl_context())
        else:
            conn = http.client.HTTPConnection(host, timeout=self.connect_timeout)
        conn.connect()
        conn.sock.settimeout(self.read_timeout)
        return conn

    def _release(self, host: str, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        if resp.will_close or os.getpid() != self._pid:
            conn.close()
            return
        with self._lock:
            self._idle.setdefault(host, []).append(conn)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            if self.verify is False:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            elif isinstance(self.verify, str):
                ctx = ssl.create_default_context(cafile=self.verify)
            else:
                ctx = ssl.create_default_context()
            self._ssl = ctx
        return self._ssl

    def close(self) -> None:
        """Close the idle connections (a later request opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


_POOLS: weakref.WeakSet[ConnectionPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_POOLS):
        if pool._pid == os.getpid():
            pool.close()
