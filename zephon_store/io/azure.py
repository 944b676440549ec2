"""``az://`` and ``abfs://`` storage: Azure Blob's REST API over pooled HTTP connections.

The same client shape as ``gs://`` (io/gcs.py, on :class:`~zephon_store.io.object_store.
ObjectStore`): ranged and whole GETs, listings, one-request uploads, deletes, and the output
lock's conditional writes on ETags (``If-None-Match: *`` creates only where nothing is,
``If-Match: <etag>`` replaces or deletes only the version that was read). No Azure SDK is
imported: a Shared Key request is signed here (HMAC-SHA256 of the canonical request, as the
REST API specifies), and a token credential (azure-identity's, any object with
``get_token(scope)``) is asked for a bearer token, again after a 401 or a 403 that says the
token expired, and the request is sent once more.

URLs: ``az://container/prefix`` and ``abfs://container/prefix`` (the account from the storage
options), or ``abfs://container@account.dfs.core.windows.net/prefix`` (adlfs's form: the
account from the host). Blobs are read and written through the Blob endpoint either way.

>>> parse_connection_string("AccountName=a;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:1/a")
{'AccountName': 'a', 'AccountKey': 'a2V5', 'BlobEndpoint': 'http://127.0.0.1:1/a'}
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import threading
import time
import urllib.parse
from email.utils import formatdate
from typing import Any

from .object_store import ObjectStore, PreconditionFailed, check_md5, raise_for, range_body

OPTIONS = frozenset({"account_name", "account_key", "connection_string", "credential",
                     "sas_token", "endpoint_url", "connect_timeout", "read_timeout", "verify",
                     "anon", "retry"})
_VERSION = "2021-08-06"
_SCOPE = "https://storage.azure.com/.default"
_CODE_RE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE_RE = re.compile(rb"<Message>([^<]{0,500})</Message>")
# A refreshed token is asked for this long before the one held expires.
_EARLY_S = 300
# The error codes of a token or signature that expired (the request is re-sent once with a
# fresh one).
_EXPIRED = frozenset({"InvalidAuthenticationInfo", "AuthenticationFailed", "ExpiredToken"})


def parse_connection_string(text: str) -> dict[str, str]:
    """The ``Key=Value`` pairs of an Azure Storage connection string."""
    out = {}
    for part in text.split(";"):
        key, sep, value = part.partition("=")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def check_options(storage_options: dict[str, Any]) -> None:
    """Refuse an ``az://`` storage option this client does not take, naming the accepted ones.

    >>> check_options({"account_name": "a"})
    """
    for key in storage_options:
        if key not in OPTIONS:
            from ..errors import StorageOptionsError

            raise StorageOptionsError(
                f"unknown storage option {key!r} for az://; accepted: "
                f"{', '.join(sorted(OPTIONS))}. Credentials can also come from "
                f"AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
                f"AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN")


def from_options(storage_options: dict[str, Any], host_account: str | None = None) -> AzureStore:
    """An :class:`AzureStore` for these storage options: ``connection_string`` (else
    ``AZURE_STORAGE_CONNECTION_STRING``), or ``account_name`` (else the URL's host, else
    ``AZURE_STORAGE_ACCOUNT_NAME``) with ``account_key``, ``sas_token``, a token
    ``credential`` or ``anon=True``; without any of these, azure-identity's
    ``DefaultAzureCredential`` (the ``azure`` extra). ``endpoint_url``: the Blob endpoint
    (default ``https://<account>.blob.core.windows.net``)."""
    opts = dict(storage_options or {})
    check_options(opts)
    env = os.environ
    conn = parse_connection_string(opts.get("connection_string")
                                   or env.get("AZURE_STORAGE_CONNECTION_STRING") or "")
    account = (opts.get("account_name") or conn.get("AccountName") or host_account
               or env.get("AZURE_STORAGE_ACCOUNT_NAME"))
    if not account:
        from ..errors import StorageOptionsError

        raise StorageOptionsError(
            "az:// needs an account: storage option account_name or connection_string, "
            "AZURE_STORAGE_ACCOUNT_NAME or AZURE_STORAGE_CONNECTION_STRING, or a URL "
            "abfs://container@ACCOUNT.dfs.core.windows.net/path")
    endpoint = (opts.get("endpoint_url") or conn.get("BlobEndpoint")
                or f"https://{account}.blob.core.windows.net")
    key = opts.get("account_key") or conn.get("AccountKey") or (
        env.get("AZURE_STORAGE_ACCOUNT_KEY") if not opts.get("credential") else None)
    sas = (opts.get("sas_token") or conn.get("SharedAccessSignature")
           or env.get("AZURE_STORAGE_SAS_TOKEN") or "").lstrip("?")
    credential = opts.get("credential")
    if not (key or sas or credential or opts.get("anon")):
        from ..errors import require

        identity = require("azure.identity", "azure")
        credential = identity.DefaultAzureCredential()
    return AzureStore(endpoint=endpoint, account=account, account_key=key, sas_token=sas,
                      credential=credential,
                      connect_timeout=float(opts.get("connect_timeout", 5)),
                      read_timeout=float(opts.get("read_timeout", 30)),
                      verify=opts.get("verify", True))


class AzureStore(ObjectStore):
    """The ``az://`` operations zephon makes (:class:`~zephon_store.io.object_store.
    ObjectStore`) over Azure Blob's REST API; an object's tag is its ETag.

    Authorised by ``account_key`` (Shared Key), else ``sas_token``, else ``credential`` (a
    token credential, refreshed before expiry and after an expired-token answer), else not
    at all (public containers).
    """

    def __init__(self, *, endpoint: str, account: str, account_key: str | None = None,
                 sas_token: str = "", credential: Any = None, connect_timeout: float = 5.0,
                 read_timeout: float = 30.0, verify: Any = True) -> None:
        super().__init__(endpoint, connect_timeout=connect_timeout, read_timeout=read_timeout,
                         verify=verify)
        self.account = account
        self._key = base64.b64decode(account_key) if account_key else None
        self.sas_token = sas_token
        self.credential = credential
        self._token: Any = None
        self._auth_lock = threading.Lock()
        self.refreshes = 0   # tokens asked for (the start, expiry, expired-token answers)

    @staticmethod
    def split_path(path: str) -> tuple[str, str]:
        """``(container, blob)`` of ``container/blob`` or ``container@account.host/blob``."""
        container, _, key = path.strip("/").partition("/")
        return container.split("@", 1)[0], key

    def _blob_path(self, container: str, key: str = "") -> str:
        quoted = urllib.parse.quote(key, safe="/~")
        return f"{self.base}/{urllib.parse.quote(container, safe='')}" + (
            f"/{quoted}" if key else "")

    # -- requests ---------------------------------------------------------------------------

    def _bearer(self, *, force: bool) -> str:
        with self._auth_lock:
            token = self._token
            if force or token is None or token.expires_on - _EARLY_S < time.time():
                self._token = token = self.credential.get_token(_SCOPE)
                self.refreshes += 1
            return f"Bearer {token.token}"

    def _sign(self, method: str, path: str, query: dict[str, str], headers: dict[str, str],
              length: int) -> str:
        """The Shared Key ``Authorization`` of a request (the REST API's string to sign)."""
        h = {k.lower(): v for k, v in headers.items()}
        ms = "".join(f"{k}:{h[k].strip()}\n" for k in sorted(h) if k.startswith("x-ms-"))
        resource = f"/{self.account}{path}" + "".join(
            f"\n{k.lower()}:{v}" for k, v in sorted(query.items()))
        fields = [method, h.get("content-encoding", ""), h.get("content-language", ""),
                  str(length) if length else "", h.get("content-md5", ""),
                  h.get("content-type", ""), "", h.get("if-modified-since", ""),
                  h.get("if-match", ""), h.get("if-none-match", ""),
                  h.get("if-unmodified-since", ""), h.get("range", "")]
        to_sign = "\n".join(fields) + "\n" + ms + resource
        digest = hmac.new(self._key, to_sign.encode("utf-8"), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode('ascii')}"

    def _request(self, method: str, path: str, *, query: dict[str, str] | None = None,
                 headers: dict[str, str] | None = None, body: Any = None, length: int = 0,
                 ok: tuple[int, ...] = (200,)) -> tuple[Any, bytes]:
        """One request; an expired token is replaced and the request sent once more."""
        query = dict(query or {})
        for fresh in (False, True):
            if fresh and self.credential is None:
                break
            all_headers = {**(headers or {}), "x-ms-version": _VERSION,
                           "x-ms-date": formatdate(usegmt=True)}
            if body is not None or method in ("PUT", "POST"):
                all_headers["Content-Length"] = str(length)
            if self._key is not None:
                all_headers["Authorization"] = self._sign(method, path, query, all_headers,
                                                          length)
            elif self.credential is not None:
                all_headers["Authorization"] = self._bearer(force=fresh)
            full_query = urllib.parse.urlencode(query)
            if self.sas_token and self._key is None:
                full_query = "&".join(q for q in (full_query, self.sas_token) if q)
            target = path + (f"?{full_query}" if full_query else "")
            if hasattr(body, "seek"):
                body.seek(0)

            def send(conn, all_headers=all_headers, target=target) -> None:
                conn.request(method, target, body=body, headers=all_headers)

            resp, data = self.pool.request(self.netloc, send)
            if resp.status in ok:
                return resp, data
            code, message = _error(data, resp)
            if not (resp.status == 401 or (resp.status == 403 and code in _EXPIRED)):
                break
        url = f"{self.pool.scheme}://{self.netloc}{path}"
        if resp.status == 409 and code == "BlobAlreadyExists":
            raise PreconditionFailed(f"409 {code}: {message} ({url})")
        raise_for(resp.status, code, message, url)
        raise AssertionError("unreachable")  # pragma: no cover

    def get(self, bucket: str, key: str, start: int | None = None,
            end: int | None = None) -> bytes:
        headers = {"x-ms-range": f"bytes={start}-{end - 1}"} if start is not None else {}
        resp, body = self._request("GET", self._blob_path(bucket, key), headers=headers,
                                   ok=(200, 206))
        url = f"az://{bucket}/{key}"
        if start is None:
            check_md5(resp.getheader("Content-MD5"), body, url, "Content-MD5")
            return body
        return range_body(resp.status, resp.getheader("Content-Range", ""), body, start, end,
                          url)

    def info(self, path: str) -> dict[str, Any]:
        container, key = self.split_path(path)
        if not key:
            raise FileNotFoundError(path)
        resp, _ = self._request("HEAD", self._blob_path(container, key))
        return {"name": f"{container}/{key}", "type": "file",
                "size": int(resp.getheader("Content-Length") or 0),
                "tag": resp.getheader("ETag") or ""}

    def _list(self, prefix: str, *, delimiter: bool, limit: int | None = None
              ) -> tuple[list[dict[str, Any]], list[str]]:
        container, key = self.split_path(prefix)
        key = key + "/" if prefix.endswith("/") and key and not key.endswith("/") else key
        files: list[dict[str, Any]] = []
        folders: list[str] = []
        marker = ""
        while True:
            query = {"restype": "container", "comp": "list", "prefix": key,
                     "maxresults": str(limit or 5000)}
            if delimiter:
                query["delimiter"] = "/"
            if marker:
                query["marker"] = marker
            _, body = self._request("GET", self._blob_path(container), query=query)
            for blob in re.findall(rb"<Blob>(.*?)</Blob>", body, re.S):
                name = _xml_text(blob, b"Name")
                files.append({"name": f"{container}/{name}", "type": "file",
                              "size": int(_xml_text(blob, b"Content-Length") or 0),
                              "tag": _xml_text(blob, b"Etag")})
            for sub in re.findall(rb"<BlobPrefix>(.*?)</BlobPrefix>", body, re.S):
                folders.append(f"{container}/{_xml_text(sub, b'Name').rstrip('/')}")
            marker = _xml_text(body.rsplit(b"</Blobs>", 1)[-1], b"NextMarker")
            if not marker or limit:
                return files, folders

    def _upload(self, path: str, body: Any, length: int, *,
                condition: str | None = None) -> None:
        container, key = self.split_path(path)
        headers = {"x-ms-blob-type": "BlockBlob", "Content-Type": "application/octet-stream"}
        if condition == "absent":
            headers["If-None-Match"] = "*"
        elif condition is not None:
            headers["If-Match"] = condition
        self._request("PUT", self._blob_path(container, key), headers=headers, body=body,
                      length=length, ok=(201,))

    def rm_file(self, path: str) -> None:
        self._request("DELETE", self._blob_path(*self.split_path(path)), ok=(202,))

    def delete_if_match(self, path: str, tag: str) -> bool:
        try:
            self._request("DELETE", self._blob_path(*self.split_path(path)),
                          headers={"If-Match": tag}, ok=(202,))
            return True
        except (PreconditionFailed, FileNotFoundError):
            return False


def _xml_text(xml: bytes, tag: bytes) -> str:
    m = re.search(b"<" + tag + rb">([^<]*)</" + tag + b">", xml)
    if not m:
        return ""
    import html

    return html.unescape(m.group(1).decode("utf-8"))


def _error(body: bytes, resp: Any) -> tuple[str, str]:
    code = _CODE_RE.search(body)
    message = _MESSAGE_RE.search(body)
    return ((code.group(1).decode("ascii", "replace") if code
             else resp.getheader("x-ms-error-code") or ""),
            message.group(1).decode("utf-8", "replace").split("\n")[0] if message else "")
