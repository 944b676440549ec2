"""``gs://`` storage: Google Cloud Storage's JSON API over pooled HTTP connections.

A rank's reads are ranged GETs of shards and whole GETs of small objects, exactly as on S3
(io/s3_get.py). gcsfs would serve them, at a cost on every rank's start: importing it brings
aiohttp, google-auth and google-cloud-storage (0.32-0.36 s of CPU, 57 MB, measured in
docs/storage.md), and it retries 6 times with up to 32 s sleeps under our own retry layer,
so the layers multiply. This client sends the requests itself with ``http.client``; the
only cloud import is google-auth, and only where credentials are needed (not against an
emulator, not for ``token="anon"``).

It is also what the writer and the output lock use on ``gs://``: uploads, listings, deletes,
and the conditional writes GCS offers through object generations. ``ifGenerationMatch=0``
creates only where nothing is; ``ifGenerationMatch=<generation>`` replaces or deletes only
the version that was read. An object's *tag* for the lock's compare-and-swap is its
generation, as an S3 object's is its ETag.

Errors look like botocore's to :mod:`~zephon_store.io.retry` (the status rides in
``exc.response``): 429/503 throttle, 5xx transient, 404 ``FileNotFoundError``, 401/403
``PermissionError``. A 401 (an access token that expired between its refresh and the
request, e.g. between the prefetch plan and the GET) refreshes the credentials and sends
the request once more, at once.

>>> store = GCSStore(endpoint="http://127.0.0.1:9", credentials=None)
>>> store.object_url("bucket", "ds/shards/a b.parquet")
'http://127.0.0.1:9/storage/v1/b/bucket/o/ds%2Fshards%2Fa%20b.parquet'
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
import uuid
from typing import Any

from .object_store import ObjectStore, PreconditionFailed, check_md5, raise_for, range_body

DEFAULT_ENDPOINT = "https://storage.googleapis.com"
# The emulator variable that google-cloud-storage and gcsfs honour: its host, no auth.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
OPTIONS = frozenset({"token", "endpoint_url", "connect_timeout", "read_timeout", "verify",
                     "retry"})
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_PAGE = 1000


def check_options(storage_options: dict[str, Any]) -> None:
    """Refuse a ``gs://`` storage option this client does not take, naming the accepted ones.

    >>> check_options({"token": "anon"})
    >>> check_options({"project": "p"})
    Traceback (most recent call last):
    ...
    zephon_store.errors.StorageOptionsError: unknown storage option 'project' for gs://; accepted: connect_timeout, endpoint_url, read_timeout, retry, token, verify. Credentials come from GOOGLE_APPLICATION_CREDENTIALS or the metadata server when no token is given; an emulator from STORAGE_EMULATOR_HOST
    """
    for key in storage_options:
        if key not in OPTIONS:
            from ..errors import StorageOptionsError

            raise StorageOptionsError(
                f"unknown storage option {key!r} for gs://; accepted: "
                f"{', '.join(sorted(OPTIONS))}. Credentials come from "
                f"GOOGLE_APPLICATION_CREDENTIALS or the metadata server when no token is "
                f"given; an emulator from {EMULATOR_ENV}")


def from_options(storage_options: dict[str, Any]) -> GCSStore:
    """A :class:`GCSStore` for these storage options.

    ``endpoint_url`` (else ``STORAGE_EMULATOR_HOST``, else Google's); ``token``: ``"anon"``
    (no auth: public buckets, emulators), a service-account JSON file, or a google-auth
    credentials object; without one, google-auth's default chain
    (``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's user credentials, the metadata server).
    With only the emulator variable, requests are unsigned, as gcsfs sends them."""
    opts = dict(storage_options or {})
    check_options(opts)
    emulator = os.environ.get(EMULATOR_ENV)
    endpoint = opts.get("endpoint_url") or (
        (emulator if "://" in emulator else f"http://{emulator}") if emulator else None)
    token = opts.get("token")
    if token is None and (emulator and not opts.get("endpoint_url")):
        token = "anon"
    credentials = None if token == "anon" else _credentials(token)
    try:
        timeouts = (float(opts.get("connect_timeout", 5)), float(opts.get("read_timeout", 30)))
        if min(timeouts) <= 0:
            raise ValueError
    except (TypeError, ValueError):
        from ..errors import StorageOptionsError

        raise StorageOptionsError(
            f"storage options connect_timeout and read_timeout must be seconds > 0, got "
            f"{opts.get('connect_timeout')!r}, {opts.get('read_timeout')!r}") from None
    return GCSStore(endpoint=endpoint, credentials=credentials, connect_timeout=timeouts[0],
                    read_timeout=timeouts[1], verify=opts.get("verify", True))


def _credentials(token: Any) -> Any:
    from ..errors import require

    require("google.auth", "gcs")
    if token is None:
        import google.auth

        credentials, _ = google.auth.default(scopes=[_SCOPE])
        return credentials
    if isinstance(token, str):
        from google.oauth2 import service_account

        return service_account.Credentials.from_service_account_file(token, scopes=[_SCOPE])
    return token   # a google-auth credentials object


class GCSStore(ObjectStore):
    """The ``gs://`` operations zephon makes (:class:`~zephon_store.io.object_store.ObjectStore`)
    over GCS's JSON API; an object's tag is its generation.

    ``credentials``: a google-auth credentials object, refreshed before it expires and after
    a 401 (None: unsigned).
    """

    def __init__(self, *, endpoint: str | None, credentials: Any,
                 connect_timeout: float = 5.0, read_timeout: float = 30.0,
                 verify: Any = True) -> None:
        super().__init__(endpoint or DEFAULT_ENDPOINT, connect_timeout=connect_timeout,
                         read_timeout=read_timeout, verify=verify)
        self.credentials = credentials
        self._auth_lock = threading.Lock()
        self.refreshes = 0   # credential refreshes made (the start, expiry, 401s)

    def object_url(self, bucket: str, key: str) -> str:
        """The JSON API URL of object ``key`` in ``bucket`` (the key fully quoted)."""
        return f"{self.pool.scheme}://{self.netloc}{self._object_path(bucket, key)}"

    def _object_path(self, bucket: str, key: str) -> str:
        return (f"{self.base}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/"
                f"{urllib.parse.quote(key, safe='')}")

    # -- requests ---------------------------------------------------------------------------

    def _headers(self, *, force_refresh: bool = False) -> dict[str, str]:
        if self.credentials is None:
            return {}
        with self._auth_lock:
            if force_refresh or not self.credentials.valid:
                import google.auth.transport.requests

                self.credentials.refresh(google.auth.transport.requests.Request())
                self.refreshes += 1
            return {"Authorization": f"Bearer {self.credentials.token}"}

    def _request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None, body: Any = None,
                 ok: tuple[int, ...] = (200,)) -> tuple[Any, bytes]:
        """One request; a 401 refreshes the credentials and sends it once more."""
        target = path + ("?" + urllib.parse.urlencode(query) if query else "")
        url = f"{self.pool.scheme}://{self.netloc}{target}"
        for refresh in (False, True):
            if refresh and self.credentials is None:
                break
            all_headers = {**(headers or {}), **self._headers(force_refresh=refresh)}
            if hasattr(body, "seek"):
                body.seek(0)

            def send(conn, all_headers=all_headers) -> None:
                conn.request(method, target, body=body, headers=all_headers)

            resp, data = self.pool.request(self.netloc, send)
            if resp.status in ok:
                return resp, data
            if resp.status != 401:
                break
        raise_for(resp.status, "", _message(data), url)
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, bucket: str, key: str, start: int | None = None,
            end: int | None = None) -> bytes:
        """Object ``bucket``/``key``, whole or bytes ``[start, end)``: one GET. A whole
        object is checked against the MD5 GCS sends with it (``x-goog-hash``)."""
        path = self._object_path(bucket, key)
        headers = {"Range": f"bytes={start}-{end - 1}"} if start is not None else {}
        resp, body = self._request("GET", path, query={"alt": "media"}, headers=headers,
                                   ok=(200, 206))
        url = f"gs://{bucket}/{key}"
        if start is None:
            md5 = [v for n, _, v in (p.strip().partition("=") for p in
                                     (resp.getheader("x-goog-hash") or "").split(","))
                   if n == "md5"]
            check_md5(md5[0] if md5 else None, body, url, "x-goog-hash md5")
            return body
        return range_body(resp.status, resp.getheader("Content-Range", ""), body, start, end,
                          url)

    def info(self, path: str) -> dict[str, Any]:
        """``{"name", "size", "type": "file", "generation"}`` of an object."""
        bucket, key = self.split_path(path)
        _, body = self._request("GET", self._object_path(bucket, key))
        meta = json.loads(body)
        return {"name": f"{bucket}/{meta['name']}", "size": int(meta.get("size", 0)),
                "type": "file", "tag": str(meta.get("generation", ""))}

    def _list(self, prefix: str, *, delimiter: bool, limit: int | None = None
              ) -> tuple[list[dict[str, Any]], list[str]]:
        bucket, key = self.split_path(prefix)
        key = key + "/" if prefix.endswith("/") and key and not key.endswith("/") else key
        files: list[dict[str, Any]] = []
        folders: list[str] = []
        token = None
        while True:
            query = {"prefix": key, "maxResults": str(limit or _PAGE)}
            if delimiter:
                query["delimiter"] = "/"
            if token:
                query["pageToken"] = token
            _, body = self._request(
                "GET", f"{self.base}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o",
                query=query)
            page = json.loads(body)
            files += [{"name": f"{bucket}/{item['name']}", "size": int(item.get("size", 0)),
                       "type": "file", "tag": str(item.get("generation", ""))}
                      for item in page.get("items", [])]
            folders += [f"{bucket}/{p.rstrip('/')}" for p in page.get("prefixes", [])]
            token = page.get("nextPageToken")
            if not token or limit:
                return files, folders

    def _upload(self, path: str, body: Any, length: int, *,
                condition: str | None = None) -> None:
        bucket, key = self.split_path(path)
        base = f"{self.base}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        if condition is None:
            # One media upload: the body streams from memory or a file.
            self._request("POST", base, query={"uploadType": "media", "name": key},
                          headers={"Content-Type": "application/octet-stream",
                                   "Content-Length": str(length)}, body=body)
            return
        generation = "0" if condition == "absent" else condition
        # Conditional: a multipart upload (object metadata + bytes), the form whose
        # ifGenerationMatch GCS and fake-gcs-server both honour.
        data = body if isinstance(body, bytes) else body.read()
        boundary = uuid.uuid4().hex
        payload = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                   f"{json.dumps({'name': key})}\r\n--{boundary}\r\n"
                   f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + \
            f"\r\n--{boundary}--\r\n".encode()
        self._request(
            "POST", base, query={"uploadType": "multipart", "ifGenerationMatch": generation},
            headers={"Content-Type": f"multipart/related; boundary={boundary}"}, body=payload)

    def rm_file(self, path: str) -> None:
        """Delete an object (``FileNotFoundError`` when absent)."""
        self._request("DELETE", self._object_path(*self.split_path(path)), ok=(200, 204))

    def delete_if_match(self, path: str, tag: str) -> bool:
        """Delete ``path`` only while its generation is ``tag``; False when it changed or is
        gone. (fake-gcs-server ignores this precondition on DELETE; GCS honours it.)"""
        try:
            self._request("DELETE", self._object_path(*self.split_path(path)),
                          query={"ifGenerationMatch": tag}, ok=(200, 204))
            return True
        except (PreconditionFailed, FileNotFoundError):
            return False


def _message(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        return str(error.get("message") if isinstance(error, dict) else error)[:500]
    except (ValueError, AttributeError):
        return body[:200].decode("utf-8", "replace")
