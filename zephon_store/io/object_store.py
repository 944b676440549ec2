"""The shape every object store client of zephon's own has (io/gcs.py, io/azure.py).

A store is a handful of primitives (a GET whole or ranged, an object's metadata, a listing
page, an upload conditional or not, a delete) over pooled ``http.client`` connections. This
base builds on them what :class:`~zephon_store.io.storage.Storage` calls, with fsspec's names
where fsspec has one (``cat_file``, ``info``, ``size``, ``exists``, ``ls``, ``find``,
``pipe_file``, ``put_file``, ``rm_file``, ``rm``), and the conditional writes of the output
lock (``tag``, ``replace_if_match``, ``delete_if_match``). Paths are ``bucket/key`` (a
container on Azure). Nothing here retries: :mod:`~zephon_store.io.retry` is the one layer.

>>> ObjectStore.split_path("bucket/ds/manifest.json")
('bucket', 'ds/manifest.json')
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from .http_pool import ConnectionPool
from .s3_get import ChecksumMismatch


class PreconditionFailed(FileExistsError):
    """412 (or 409 on a create-only write): the object is not in the state the request was
    conditional on."""


class StoreResponseError(OSError):
    """An error answer; ``response`` has botocore's shape (``Error.Code``, the HTTP status) so
    that :mod:`~zephon_store.io.retry` classifies it as it does S3's (429/503 throttle,
    5xx transient)."""

    def __init__(self, status: int, code: str, message: str, url: str) -> None:
        super().__init__(f"{status} {code}: {message} ({url})")
        self.response = {"Error": {"Code": code or str(status), "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


class StoreNotFound(FileNotFoundError):
    """404: the object or its bucket (container) does not exist."""


class StoreDenied(PermissionError):
    """401/403: the credentials are missing, expired past a refresh, or not allowed."""


def raise_for(status: int, code: str, message: str, url: str) -> None:
    """Raise the exception of an error answer (never returns)."""
    if status == 404:
        raise StoreNotFound(f"404 {code}: {message} ({url})")
    if status in (401, 403):
        raise StoreDenied(f"{status} {code}: {message} ({url})")
    if status == 412:
        raise PreconditionFailed(f"412 {code}: {message} ({url})")
    raise StoreResponseError(status, code, message, url)


def check_md5(expected_b64: str | None, body: bytes, url: str, header: str) -> None:
    """Raise :class:`~zephon_store.io.s3_get.ChecksumMismatch` (re-fetched like an xxh3
    mismatch) when the store sent an MD5 of the whole object and ``body`` does not have it."""
    if not expected_b64:
        return
    digest = base64.b64encode(hashlib.md5(body).digest()).decode("ascii")
    if digest != expected_b64.strip():
        raise ChecksumMismatch(f"{url}: the body ({len(body)} bytes) does not match {header} "
                               f"{expected_b64!r} (computed {digest!r})")


def range_body(status: int, content_range: str, body: bytes, start: int, end: int,
                url: str) -> bytes:
    """Bytes ``[start, end)`` of a ranged GET's answer: a 206 must start where asked (its
    length is checked by the caller), a 200 is the whole object, sliced."""
    if status == 206:
        if not content_range.startswith(f"bytes {start}-"):
            raise StoreResponseError(502, "BadContentRange",
                                     f"asked bytes {start}-{end - 1}, got {content_range!r}",
                                     url)
        return body
    return body[start:end]


class ObjectStore:
    """Base of zephon's own store clients; subclasses give the primitives (``get``, ``info``,
    ``_list``, ``_upload``, ``rm_file``, ``delete_if_match``). Safe to share between threads
    and across ``fork`` (its :class:`~zephon_store.io.http_pool.ConnectionPool`)."""

    def __init__(self, endpoint: str, *, connect_timeout: float, read_timeout: float,
                 verify: Any) -> None:
        self.endpoint = endpoint.rstrip("/")
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"endpoint must be http(s)://host[:port][/path], got {endpoint!r}")
        self.netloc = parts.netloc
        self.base = parts.path.rstrip("/")
        self.pool = ConnectionPool(parts.scheme, connect_timeout=connect_timeout,
                                   read_timeout=read_timeout, verify=verify)

    # -- what subclasses give ---------------------------------------------------------------

    def get(self, bucket: str, key: str, start: int | None = None,
            end: int | None = None) -> bytes:
        """Object ``bucket``/``key``, whole (checked against the store's MD5 if it sent one)
        or bytes ``[start, end)``: one GET."""
        raise NotImplementedError

    def info(self, path: str) -> dict[str, Any]:
        """``{"name", "size", "type": "file", "tag"}`` of an object."""
        raise NotImplementedError

    def _list(self, prefix: str, *, delimiter: bool, limit: int | None = None
              ) -> tuple[list[dict[str, Any]], list[str]]:
        """``(files as info dicts, folders as bucket/prefix)`` under ``bucket/prefix``, every
        page (or the first ``limit`` entries)."""
        raise NotImplementedError

    def _upload(self, path: str, body: Any, length: int, *,
                condition: str | None = None) -> None:
        """Write an object in one request. ``condition``: None (unconditional), ``"absent"``
        (create only) or a tag (replace only that version); a failed one raises
        :class:`PreconditionFailed`."""
        raise NotImplementedError

    def rm_file(self, path: str) -> None:
        """Delete an object (``FileNotFoundError`` when absent)."""
        raise NotImplementedError

    def delete_if_match(self, path: str, tag: str) -> bool:
        """Delete ``path`` only while its tag is ``tag``; False when it changed or is gone."""
        raise NotImplementedError

    # -- built on them ------------------------------------------------------------------------

    @staticmethod
    def _strip_protocol(url: str) -> str:
        return url.split("://", 1)[-1].strip("/")

    @staticmethod
    def split_path(path: str) -> tuple[str, str]:
        """``(bucket, key)`` of ``bucket/key``."""
        bucket, _, key = path.strip("/").partition("/")
        return bucket, key

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """fsspec's name for :meth:`get`."""
        return self.get(*self.split_path(path), start, end)

    def size(self, path: str) -> int:
        """Bytes of an object (``FileNotFoundError`` when absent)."""
        return int(self.info(path)["size"])

    def exists(self, path: str) -> bool:
        """True for an object or a non-empty folder (a prefix)."""
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            files, folders = self._list(path.rstrip("/") + "/", delimiter=True, limit=1)
            return bool(files or folders)

    def ls(self, path: str, detail: bool = False) -> list[Any]:
        """The direct children of folder ``path`` (``FileNotFoundError`` when none)."""
        files, folders = self._list(path.rstrip("/") + "/", delimiter=True)
        if not files and not folders:
            raise FileNotFoundError(path)
        if detail:
            return files + [{"name": f, "size": 0, "type": "directory"} for f in folders]
        return [f["name"] for f in files] + folders

    def find(self, path: str) -> list[str]:
        """Every object under folder ``path``, at any depth."""
        return [f["name"] for f in self._list(path.rstrip("/") + "/", delimiter=False)[0]]

    def pipe_file(self, path: str, data: bytes, mode: str = "overwrite") -> None:
        """Write ``data`` at ``path`` in one request; ``mode="create"``: only where nothing is,
        else ``FileExistsError``."""
        self._upload(path, bytes(data), len(data),
                     condition="absent" if mode == "create" else None)

    def put_file(self, lpath: str, rpath: str) -> None:
        """Upload the local file ``lpath`` to ``rpath`` (streamed, one request)."""
        with open(lpath, "rb") as f:
            self._upload(rpath, f, os.fstat(f.fileno()).st_size)

    def rm(self, paths: list[str] | str) -> None:
        """Delete objects (missing ones are fine)."""
        for path in [paths] if isinstance(paths, str) else paths:
            try:
                self.rm_file(path)
            except FileNotFoundError:
                pass

    def tag(self, path: str) -> str:
        """What :meth:`replace_if_match` and :meth:`delete_if_match` are conditional on (a
        GCS generation, an Azure ETag)."""
        return str(self.info(path)["tag"])

    def replace_if_match(self, path: str, data: bytes, tag: str) -> bool:
        """Overwrite ``path`` only while its tag is ``tag``; False when it changed or is gone."""
        try:
            self._upload(path, bytes(data), len(data), condition=tag)
            return True
        except (PreconditionFailed, FileNotFoundError):
            return False

    def close(self) -> None:
        """Close the idle connections."""
        self.pool.close()


_STORES: dict[str, ObjectStore] = {}
_STORES_LOCK = threading.Lock()


def store_for(storage_options: dict[str, Any], key: Callable[[dict], str],
              make: Callable[[dict[str, Any]], ObjectStore]) -> ObjectStore:
    """This process's store for these options, made once by ``make`` (credentials resolved
    then, refreshed as they expire); ``key`` makes the options' cache key."""
    k = key(storage_options)
    with _STORES_LOCK:
        if k in _STORES:
            return _STORES[k]
    store = make({n: v for n, v in storage_options.items() if n != "retry"})
    with _STORES_LOCK:
        return _STORES.setdefault(k, store)
