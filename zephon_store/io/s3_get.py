"""The read path's S3 client: signed GETs over pooled HTTP connections, without s3fs.

A loader's reads are two kinds of request, a whole small object (the manifest, an index
table) and a byte range of a shard. Building an s3fs filesystem for them costs a fresh
process ~0.6 s of CPU before its first request: importing s3fs, aiobotocore and aiohttp
(~0.35 s), then a botocore client that parses the S3 API's JSON models (~0.3 s). Every rank
of a node pays it at the start, on the path to its first batch (docs/benchmarks_start.md).
This client sends the same GETs with botocore's own SigV4 signer and credential chain
(``botocore.auth``, ``botocore.credentials``: ~0.1 s, no models) over ``http.client``.

It is used for ``s3://`` reads when :func:`lean_options` accepts the storage options (keys,
a profile or the environment's credential chain, an endpoint, timeouts, TLS verification);
anything else (proxies, SSE-C, requester pays, other botocore settings) keeps the s3fs
path, and so does the storage option ``{"s3_client": "s3fs"}``. Writes, listings and HEADs
always go through s3fs.

Errors look like botocore's to :mod:`~zephon_store.io.retry`: an answer's status and S3
code ride in ``exc.response`` (``SlowDown``/503/429 are throttles, 5xx transient), 404 is a
``FileNotFoundError``, 401/403 a ``PermissionError``, a dropped or truncated connection an
``OSError``/``http.client`` error that the retry layer already knows as transient. A bucket
in another region than the one signed for raises :class:`WrongRegion`, on which the caller
falls back to s3fs (botocore follows S3's region redirects).

>>> client = LeanS3(endpoint="http://127.0.0.1:9", region="us-east-1", credentials=None)
>>> client.url_for("bucket", "ds/manifest.json")
'http://127.0.0.1:9/bucket/ds/manifest.json'
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import os
import re
import threading
import urllib.parse
import zlib
from collections.abc import Callable
from typing import Any

from .http_pool import ConnectionPool
from .retry import STALE_CREDENTIAL_CODES

# Storage options this client honours; the values of the nested dicts are checked below.
_PLAIN_KEYS = frozenset({"key", "secret", "token", "endpoint_url", "anon", "profile",
                         "use_listings_cache", "listings_expiry_time", "max_paths",
                         "skip_instance_cache", "default_block_size", "default_fill_cache",
                         "default_cache_type", "retry", "s3_client", "client_kwargs",
                         "config_kwargs"})
_CLIENT_KEYS = frozenset({"endpoint_url", "region_name", "verify", "aws_access_key_id",
                          "aws_secret_access_key", "aws_session_token"})
_CONFIG_KEYS = frozenset({"connect_timeout", "read_timeout", "retries", "region_name",
                          "max_pool_connections", "s3"})
# Environment that changes how botocore connects (proxies, FIPS or dual-stack endpoints):
# with any of it set, the s3fs path keeps botocore's handling of it. (AWS_CA_BUNDLE is
# honoured here: the CA file of https connections.)
_ENV_OF_S3FS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY",
                "all_proxy", "AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT",
                "AWS_S3_US_EAST_1_REGIONAL_ENDPOINT")
CLIENT_OPTION = "s3_client"
_CLIENT_CHOICES = ("auto", "s3fs")
# The response checksums botocore checks without awscrt, in its order of preference.
_CHECKSUMS = ("crc32", "sha1", "sha256", "sha512")
_CODE_RE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_MESSAGE_RE = re.compile(rb"<Message>([^<]{0,500})</Message>")
_REGION_RE = re.compile(rb"<Region>([a-z0-9-]{1,40})</Region>")
# S3's answers to a request signed for the wrong region.
_REGION_CODES = frozenset({"AuthorizationHeaderMalformed", "PermanentRedirect",
                           "IllegalLocationConstraintException"})


class S3ResponseError(OSError):
    """An S3 error answer: ``response`` has botocore's shape (``Error.Code``,
    ``ResponseMetadata.HTTPStatusCode``) so that :mod:`~zephon_store.io.retry` classifies it
    as it does botocore's ``ClientError``."""

    def __init__(self, status: int, code: str, message: str, url: str) -> None:
        super().__init__(f"{status} {code}: {message} ({url})")
        self.response = {"Error": {"Code": code, "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


class ChecksumMismatch(OSError):
    """A whole-object GET's body does not match the ``x-amz-checksum-*`` header S3 sent
    with it (botocore's ``FlexibleChecksumError``): damaged on the way, re-fetched."""


class S3NotFound(FileNotFoundError):
    """404: the object (``NoSuchKey``) or bucket (``NoSuchBucket``) does not exist."""

    def __init__(self, code: str, message: str, url: str) -> None:
        super().__init__(f"404 {code}: {message} ({url})")
        self.response = {"Error": {"Code": code, "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": 404}}


class S3Denied(PermissionError):
    """401/403: the credentials are missing, wrong or not allowed to read the object."""

    def __init__(self, status: int, code: str, message: str, url: str) -> None:
        super().__init__(f"{status} {code}: {message} ({url})")
        self.code = code
        self.response = {"Error": {"Code": code, "Message": message},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


class WrongRegion(Exception):
    """The bucket lives in another region than the request was signed for; ``region`` is
    the one S3 named, if it did. The caller reads through s3fs instead."""

    def __init__(self, message: str, region: str | None) -> None:
        super().__init__(message)
        self.region = region


def lean_options(storage_options: dict[str, Any]) -> bool:
    """Whether :class:`LeanS3` can serve reads for these ``s3://`` storage options: every
    key is one it honours, and the environment sets no proxy or endpoint variant.

    >>> lean_options({"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9"})
    True
    >>> lean_options({"requester_pays": True}), lean_options({"s3_client": "s3fs"})
    (False, False)
    """
    opts = storage_options or {}
    if opts.get(CLIENT_OPTION, "auto") != "auto":
        return False
    if any(k not in _PLAIN_KEYS for k in opts):
        return False
    client = opts.get("client_kwargs") or {}
    config = opts.get("config_kwargs") or {}
    if not isinstance(client, dict) or not isinstance(config, dict):
        return False
    if any(k not in _CLIENT_KEYS for k in client) or any(k not in _CONFIG_KEYS for k in config):
        return False
    s3 = config.get("s3") or {}
    if not isinstance(s3, dict) or any(k != "addressing_style" for k in s3):
        return False
    if any(os.environ.get(name) for name in _ENV_OF_S3FS):
        return False
    return True


def check_client_option(storage_options: dict[str, Any]) -> None:
    """Refuse a ``s3_client`` value other than ``"auto"`` (this client where it applies) and
    ``"s3fs"`` (always s3fs)."""
    value = (storage_options or {}).get(CLIENT_OPTION, "auto")
    if value not in _CLIENT_CHOICES:
        from ..errors import StorageOptionsError

        raise StorageOptionsError(
            f"storage option {CLIENT_OPTION!r} must be one of {', '.join(_CLIENT_CHOICES)}, "
            f"got {value!r} ('auto': zephon's own GET client for reads where the options "
            f"allow it; 's3fs': s3fs for every request)")


def from_options(storage_options: dict[str, Any]) -> LeanS3 | None:
    """A :class:`LeanS3` for these storage options, or None where the s3fs path must serve
    them (:func:`lean_options`; an AWS endpoint whose region is not configured, which
    botocore finds by following S3's redirects). Resolves the credentials now: keys from the
    options, else botocore's chain (environment, profile files, SSO, container and instance
    roles), refreshed before they expire."""
    if not lean_options(storage_options):
        return None
    from ..errors import require

    require("botocore.auth", "s3")   # the s3 extra brings it (s3fs -> aiobotocore -> botocore)
    opts = storage_options
    client = opts.get("client_kwargs") or {}
    config = opts.get("config_kwargs") or {}
    endpoint = (opts.get("endpoint_url") or client.get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    session = None
    region = (client.get("region_name") or config.get("region_name")
              or os.environ.get("AWS_DEFAULT_REGION"))   # botocore's variable for it
    if not region and (opts.get("profile") or os.environ.get("AWS_PROFILE")
                       or os.path.exists(os.environ.get("AWS_CONFIG_FILE")
                                         or os.path.expanduser("~/.aws/config"))):
        # A region in the profile's config file: botocore's session reads it (~0.1 s of CPU,
        # spared when the environment or the options say it, or there is no such file).
        session = _session(opts)
        region = session.get_config_variable("region")
    if not region:
        if not endpoint:
            return None
        region = "us-east-1"
    credentials = None
    refresh = None
    if not opts.get("anon"):
        key = opts.get("key") or client.get("aws_access_key_id")
        secret = opts.get("secret") or client.get("aws_secret_access_key")
        token = opts.get("token") or client.get("aws_session_token")
        if key and secret:
            from botocore.credentials import Credentials

            credentials = Credentials(key, secret, token)
        else:
            credentials = (session or _session(opts)).get_credentials()
            if credentials is None:
                from botocore.exceptions import NoCredentialsError

                raise NoCredentialsError()
            # The chain again, from scratch: a rotated key in the environment, the profile
            # files or a credential process, or a role's new session.
            refresh = lambda: _session(opts).get_credentials()  # noqa: E731
    style, timeouts = connection_options(opts)
    return LeanS3(endpoint=endpoint, region=region, credentials=credentials, refresh=refresh,
                  path_style=style == "path" or (style == "auto" and bool(endpoint)),
                  connect_timeout=timeouts[0], read_timeout=timeouts[1],
                  verify=_verify(client.get("verify")))


def _verify(value: Any) -> Any:
    """TLS verification as botocore decides it: ``verify=False`` turns it off, a path is the
    CA bundle, else ``AWS_CA_BUNDLE`` if set, else the system's CAs."""
    if value is False or isinstance(value, str):
        return value
    return os.environ.get("AWS_CA_BUNDLE") or True


def connection_options(storage_options: dict[str, Any]) -> tuple[str, tuple[float, float]]:
    """The addressing style and (connect, read) timeouts these options ask for, checked:
    raises :class:`~zephon_store.errors.StorageOptionsError` for a value botocore would
    refuse, before any request.

    >>> connection_options({"config_kwargs": {"read_timeout": 5}})
    ('auto', (5.0, 5.0))
    """
    config = storage_options.get("config_kwargs") or {}
    style = (config.get("s3") or {}).get("addressing_style", "auto")
    try:
        timeouts = (float(config.get("connect_timeout", 5)), float(config.get("read_timeout", 30)))
        if style not in ("auto", "path", "virtual") or min(timeouts) <= 0:
            raise ValueError(style)
    except (TypeError, ValueError):
        from ..errors import StorageOptionsError

        raise StorageOptionsError(
            f"storage option 'config_kwargs': connect_timeout and read_timeout must be "
            f"seconds > 0 and s3.addressing_style one of auto, path, virtual; got "
            f"{config!r}") from None
    return style, timeouts


def _session(opts: dict[str, Any]):
    import botocore.session

    profile = opts.get("profile")
    return botocore.session.Session(profile=profile) if profile else botocore.session.Session()


class LeanS3:
    """Signed ``GetObject`` requests, whole or ranged, over kept-alive connections.

    ``endpoint``: ``http(s)://host[:port]`` (None: AWS, ``https://s3.<region>.amazonaws.com``);
    ``credentials``: botocore credentials (None: unsigned, for public buckets); ``path_style``:
    ``<endpoint>/<bucket>/<key>`` instead of ``<bucket>.<endpoint>/<key>``. Safe to share
    between threads and across ``fork`` (its :class:`~zephon_store.io.http_pool.ConnectionPool`).
    """

    def __init__(self, *, endpoint: str | None, region: str, credentials: Any,
                 path_style: bool = True, connect_timeout: float = 5.0,
                 read_timeout: float = 30.0, verify: Any = True,
                 refresh: Callable[[], Any] | None = None) -> None:
        self.region = region
        self.credentials = credentials
        self.refresh = refresh
        self.refreshes = 0   # credentials resolved again after S3 refused the ones held
        self._refresh_lock = threading.Lock()
        self.endpoint = (endpoint or f"https://s3.{region}.amazonaws.com").rstrip("/")
        parts = urllib.parse.urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"S3 endpoint must be http(s)://host[:port], got {endpoint!r}")
        self.scheme, self.netloc = parts.scheme, parts.netloc
        self.base_path = parts.path.rstrip("/")
        self.path_style = path_style
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.verify = verify
        self.pool = ConnectionPool(self.scheme, connect_timeout=connect_timeout,
                                   read_timeout=read_timeout, verify=verify)

    # -- addressing -------------------------------------------------------------------------

    def _host_and_path(self, bucket: str, key: str) -> tuple[str, str]:
        quoted = urllib.parse.quote(key, safe="/~")
        if self.path_style or "." in bucket:
            return self.netloc, f"{self.base_path}/{bucket}/{quoted}"
        return f"{bucket}.{self.netloc}", f"{self.base_path}/{quoted}"

    def url_for(self, bucket: str, key: str) -> str:
        """The request URL of ``bucket``/``key`` (no query).

        >>> LeanS3(endpoint=None, region="eu-west-1", credentials=None, path_style=False
        ...        ).url_for("b", "a key")
        'https://b.s3.eu-west-1.amazonaws.com/a%20key'
        """
        host, path = self._host_and_path(bucket, key)
        return f"{self.scheme}://{host}{path}"

    # -- requests ---------------------------------------------------------------------------

    def get(self, bucket: str, key: str, start: int | None = None,
            end: int | None = None) -> bytes:
        """Object ``bucket``/``key``, whole or bytes ``[start, end)``: one GET (two only when
        a kept-alive connection turned out to be closed before the request reached S3).

        Raises :class:`S3NotFound`, :class:`S3Denied`, :class:`S3ResponseError`,
        :class:`WrongRegion`, or the connection's ``OSError``/``http.client`` error; a body
        shorter than its ``Content-Length`` raises ``http.client.IncompleteRead``.
        """
        host, path = self._host_and_path(bucket, key)
        url = f"{self.scheme}://{host}{path}"
        # A whole object comes with S3's checksum of it, checked here (a range has none).
        headers = ({"Range": f"bytes={start}-{end - 1}"} if start is not None
                   else {"x-amz-checksum-mode": "ENABLED"})
        for fresh in (False, True):
            held = self.credentials
            signed = self._sign(url, headers)
            resp, body = self.pool.request(host, lambda conn, signed=signed: conn.request(
                "GET", path, headers=signed))
            try:
                return self._result(resp, body, url, start, end)
            except S3Denied as exc:
                if fresh or self.refresh is None or exc.code not in STALE_CREDENTIAL_CODES:
                    raise
                self._refresh_credentials(held)
        raise AssertionError("unreachable")  # pragma: no cover

    def _refresh_credentials(self, held: Any) -> None:
        """Resolve the credentials again (once for all the threads that were refused with
        ``held``): a key that was rotated, revoked or expired since it was signed with,
        also between the prefetch plan and its GET."""
        with self._refresh_lock:
            if self.credentials is held:
                self.credentials = self.refresh()
                self.refreshes += 1

    def _result(self, resp: http.client.HTTPResponse, body: bytes, url: str,
                start: int | None, end: int | None) -> bytes:
        status = resp.status
        if status == 206 and start is not None:
            got = resp.getheader("Content-Range", "")
            if not got.startswith(f"bytes {start}-"):
                raise S3ResponseError(502, "BadContentRange",
                                      f"asked bytes {start}-{end - 1}, got {got!r}", url)
            return body
        if status == 200:
            if start is None:
                _check_checksum(resp, body, url)
                return body
            return body[start:end]
        code, message, region = _error_fields(body)
        code = code or str(status)
        if status == 404:
            raise S3NotFound(code, message, url)
        if status in (401, 403) and code not in _REGION_CODES:
            raise S3Denied(status, code, message, url)
        if code in _REGION_CODES or status == 301:
            raise WrongRegion(f"{status} {code} at {url}: the bucket is in region "
                              f"{region or resp.getheader('x-amz-bucket-region')!r}, not "
                              f"{self.region!r}", region or resp.getheader("x-amz-bucket-region"))
        raise S3ResponseError(status, code, message, url)

    def _sign(self, url: str, headers: dict[str, str]) -> dict[str, str]:
        if self.credentials is None:
            return headers
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method="GET", url=url, headers=headers)
        S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region
                    ).add_auth(request)
        return dict(request.headers.items())

    def close(self) -> None:
        """Close the idle connections (a later request opens new ones)."""
        self.pool.close()


def _check_checksum(resp: http.client.HTTPResponse, body: bytes, url: str) -> None:
    """Check ``body`` against the first checksum header S3 sent that botocore would check
    (a composite ``...-N`` checksum of a multipart upload is no checksum of the body)."""
    for name in _CHECKSUMS:
        value = resp.getheader(f"x-amz-checksum-{name}")
        if not value or "-" in value:
            continue
        digest = (zlib.crc32(body).to_bytes(4, "big") if name == "crc32"
                  else hashlib.new(name, body).digest())
        if base64.b64encode(digest).decode("ascii") != value.strip():
            raise ChecksumMismatch(
                f"{url}: the body ({len(body)} bytes) does not match x-amz-checksum-{name} "
                f"{value!r} (computed {base64.b64encode(digest).decode('ascii')!r})")
        return


def _error_fields(body: bytes) -> tuple[str, str, str | None]:
    code = _CODE_RE.search(body)
    message = _MESSAGE_RE.search(body)
    region = _REGION_RE.search(body)
    return (code.group(1).decode("ascii", "replace") if code else "",
            message.group(1).decode("utf-8", "replace") if message else "",
            region.group(1).decode("ascii") if region else None)
