"""Where an input's bytes come from: a local file, or ranged GETs that are each retried.

Remote inputs go through the project's one resolver (:func:`zephon_store.io.storage.resolve`, so
endpoint, timeouts and the single-try s3fs/botocore settings are those of outputs) and its one
retry layer (:func:`zephon_store.io.retry.call_with_retry`, with the policy the ``"retry"`` storage
option asks for). A stream is read as consecutive byte ranges: when one fails (a 503, a reset,
a body cut short) it is fetched again from the offset reached, so no byte is lost or doubled,
and the length of every range is checked. Listings (glob, walk, info) are retried the same way.
Errors that outlast the retries name the file's URL.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from ..errors import InputNotFoundError
from ..io.retry import RetryPolicy, call_with_retry
from ..io.storage import is_local_url, resolve, retry_policy
from .options import InputFile

# One GET per 8 MiB: a failure costs at most this much re-fetching, and the fixed cost of a
# request stays small next to its transfer (docs/benchmarks.md). Tests shrink it.
BLOCK_BYTES = 8 << 20

_fs_cache: dict[tuple, Any] = {}
_fs_lock = threading.Lock()
_fetched = [0]  # bytes of remote inputs fetched by this process (see remote_input_bytes)


def remote_input_bytes() -> int:
    """Bytes of remote inputs this process has fetched so far (every range, retries included).

    A distributed conversion reads inputs in its workers: the driver's count stays 0.

    >>> remote_input_bytes() >= 0
    True
    """
    return _fetched[0]


def _count(data: bytes) -> bytes:
    with _fs_lock:
        _fetched[0] += len(data)
    return data


class _ShortBody(ConnectionError):
    """A range came back shorter than asked for: a body cut in transit (transient)."""


def remote_fs(url: str, storage_options: dict | None) -> tuple[Any, str, RetryPolicy]:
    """``(fs, path, retry policy)`` for a remote ``url`` (or glob); one filesystem per process
    and options, since a new S3 client costs a session and connections per input."""
    options = dict(storage_options or {})
    policy = retry_policy(options)
    key = (os.getpid(), url.split("://", 1)[0], json.dumps(options, sort_keys=True, default=repr))
    with _fs_lock:
        fs = _fs_cache.get(key)
    if fs is None:
        fs, path = resolve(url, options)
        with _fs_lock:
            _fs_cache.setdefault(key, fs)
        return fs, path, policy
    return fs, fs._strip_protocol(url).rstrip("/"), policy


def retried(fn: Callable[[], Any], policy: RetryPolicy, what: str, url: str) -> Any:
    """``fn()`` with transient failures retried; a missing object names ``url``."""
    try:
        return call_with_retry(fn, policy, what=f"{what} {url}", url=url)
    except FileNotFoundError as exc:
        if isinstance(exc, InputNotFoundError):
            raise
        raise InputNotFoundError(f"{url}: not found ({exc}); it was removed or renamed after "
                                 f"it was listed: check the input and run again") from exc


class RangedReader(io.RawIOBase):
    """A seekable read-only file over ``fetch(start, end) -> bytes``, one retried call per
    block of at most ``block`` bytes; a short range is a transient failure, fetched again."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: int, *, url: str,
                 policy: RetryPolicy, block: int | None = None) -> None:
        self._fetch, self._size, self._url, self._policy = fetch, size, url, policy
        self._block = block or BLOCK_BYTES
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def readinto(self, b) -> int:  # type: ignore[override]
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        parts = []
        while self._pos < end:
            start, stop = self._pos, min(end, self._pos + self._block)
            parts.append(retried(lambda a=start, z=stop: self._exact(a, z), self._policy,
                                 f"GET bytes {start}-{stop - 1} of", self._url))
            self._pos = stop
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _exact(self, start: int, stop: int) -> bytes:
        data = self._fetch(start, stop)
        if len(data) != stop - start:
            raise _ShortBody(f"got {len(data)} of {stop - start} bytes")
        return data


@contextlib.contextmanager
def open_raw(file: InputFile, storage_options: dict | None = None) -> Iterator[BinaryIO]:
    """The stored bytes of ``file``: a local file, or a :class:`RangedReader`."""
    if is_local_url(file.url):
        with open(file.url.removeprefix("file://"), "rb") as fh:
            yield fh
        return
    fs, path, policy = remote_fs(file.url, storage_options)
    size = int(retried(lambda: fs.info(path), policy, "HEAD", file.url).get("size") or 0)
    with RangedReader(lambda start, stop: _count(fs.cat_file(path, start=start, end=stop)), size,
                      url=file.url, policy=policy) as reader:
        yield reader  # type: ignore[misc]
