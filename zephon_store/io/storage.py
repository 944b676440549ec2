"""Dataset storage: local paths or object stores through fsspec, with ranged reads that are
retried and verified.

Every path is relative to the dataset root; reads of shard byte ranges are one ranged GET each
(never a readahead buffer), checked against the xxh3 the manifest records.

>>> st = Storage(tmp)
>>> st.write_atomic("shards/a.bin", b"hello world")
>>> st.read_range("shards/a.bin", 6, 11, expected_xxh3=xxh3_hex(b"world"))
b'world'
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from .._util.atomic import atomic_write, publish_file
from .._util.hashing import xxh3_hex
from ..errors import (
    AccessDeniedError,
    IntegrityError,
    RetriesExhaustedError,
    ShardNotFoundError,
    StorageError,
    StorageOptionsError,
    UnsafePathError,
    ZephonError,
    require,
)
from ..observe import causes
from . import azure, gcs, object_store, s3_get
from .retry import (
    RetryPolicy,
    call_with_retry,
    is_checksum_error,
    is_stale_credentials,
    is_throttle,
    is_transient,
)
from .throttle import NodeThrottle

T = TypeVar("T")
_log = logging.getLogger(__name__)

_LOCAL_PROTOCOLS = (None, "file", "local")
# Served by zephon's own clients (io/gcs.py, io/azure.py) for every operation: reads,
# writes, listings.
GCS_PROTOCOLS = ("gs", "gcs")
AZURE_PROTOCOLS = ("az", "abfs", "abfss")


def _own_store_root(path: str) -> tuple[str, str | None]:
    """``(bucket/prefix, account)`` of a gs:// or az:// URL's path; ``account`` from adlfs's
    ``container@account.dfs.core.windows.net`` form, else None."""
    path = path.strip("/")
    first, sep, rest = path.partition("/")
    container, at, host = first.partition("@")
    return container + sep + rest, (host.split(".", 1)[0] if at else None)
# zephon's own storage option: RetryPolicy fields, e.g. {"retry": {"deadline": 300}}. It rides
# in storage_options so every way in (API, ZephonLoader, the CLI's --storage-options) has it.
RETRY_OPTION = "retry"
_SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")

# botocore retries once at most (max_attempts counts the first try): our RetryPolicy is the
# layer that counts, and stacked layers multiply (s3fs x botocore x ours). read_timeout bounds a
# blackholed connection; a 1 MiB row group arrives in well under a second on a healthy link.
S3_CONFIG_DEFAULTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 30,
    "retries": {"total_max_attempts": 1, "mode": "standard"},
}
# s3fs's own retry loop (_error_wrapper); 1 means a single try.
S3FS_RETRIES = 1
# After this long a retrying operation logs one warning (the full deadline is a minute).
_WARN_RETRYING_AFTER_S = 5.0


@dataclass
class StorageStats:
    """Counters of one :class:`Storage`: every attempt is a request, also retried ones.

    ``bytes_fetched`` counts bytes returned by reads (re-fetches included);
    ``integrity_failures`` counts reads whose hash or length did not match.
    """

    requests: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    integrity_failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def _request_kind(op: str) -> str:
    """The counter of a request: ``requests.get_range``, ``requests.get``, ``requests.head``..."""
    if op.startswith("GET bytes"):
        return "requests.get_range"
    return "requests." + op.split(" ", 1)[0].lower()


class _InFlight:
    """Wall time during which this process had at least one storage request on the wire
    (the counter ``fetch_busy_s``): bytes over it is the rate storage delivers while asked,
    which the stall forecast needs (observe/stall.py); bytes over the run's time would
    count the idle time of a prefetcher that is ahead."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._n = 0
        self._since = 0.0

    def __enter__(self) -> None:
        with self._lock:
            if not self._n:
                self._since = time.perf_counter()
            self._n += 1

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._n -= 1
            if not self._n:
                causes.count("fetch_busy_s", time.perf_counter() - self._since)


_IN_FLIGHT = _InFlight()


class _Damaged(Exception):
    """A read whose bytes failed their xxh3 or length: retried like a 5xx (a flipped bit in
    transit heals on a re-fetch), reported as corrupt once the read's deadline runs out."""

    def __init__(self, actual: str | None, length: int) -> None:
        super().__init__(f"xxh3 {actual}, {length} bytes")
        self.actual = actual
        self.length = length


def is_local_url(url: str) -> bool:
    """True for plain paths and ``file://`` URLs."""
    if "://" not in url and "::" not in url:
        return True   # a plain path: local opens never import fsspec (docs/benchmarks.md)
    import fsspec.core

    protocol, _ = fsspec.core.split_protocol(url)
    return protocol in _LOCAL_PROTOCOLS


def retry_policy(storage_options: dict[str, Any] | None) -> RetryPolicy:
    """The :class:`~zephon_store.io.retry.RetryPolicy` that ``storage_options`` ask for with
    zephon's own ``"retry"`` key (fields of ``RetryPolicy``), else the default one.

    >>> retry_policy({"retry": {"deadline": 300}}).deadline
    300.0
    """
    spec = (storage_options or {}).get(RETRY_OPTION)
    if spec is None:
        return RetryPolicy()
    try:
        return RetryPolicy.from_dict(spec)
    except ValueError as exc:
        raise StorageOptionsError(
            f"storage option {RETRY_OPTION!r}: {exc} (e.g. "
            f'{{"{RETRY_OPTION}": {{"deadline": 300, "max_delay": 10}}}})') from None


# botocore create_client() arguments users pass at the top level; s3fs wants them in
# client_kwargs.
_CLIENT_KWARGS = frozenset({"region_name", "verify", "api_version", "aws_access_key_id",
                            "aws_secret_access_key", "aws_session_token"})


@functools.lru_cache(maxsize=1)
def _s3_option_names() -> frozenset[str]:
    """Every key ``S3FileSystem`` accepts: its own parameters, the fsspec listing-cache ones
    and the botocore session's (s3fs hands its leftover keywords to ``AioSession``)."""
    import aiobotocore.session
    import s3fs

    def named(fn) -> set[str]:
        return {p.name for p in inspect.signature(fn).parameters.values()
                if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    return frozenset(named(s3fs.S3FileSystem.__init__)
                     | named(aiobotocore.session.AioSession.__init__)
                     | {"use_listings_cache", "listings_expiry_time", "max_paths",
                        "skip_instance_cache", RETRY_OPTION, s3_get.CLIENT_OPTION})


def _check_s3_options(opts: dict[str, Any]) -> None:
    """Refuse a key s3fs would pass on to botocore, which fails far from here (at the first
    request, with a TypeError about an unexpected keyword) or ignores it."""
    accepted = _s3_option_names()
    for key in opts:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if key in _CLIENT_KWARGS:
                hint = " (it is a botocore client setting: put it in client_kwargs)"
            raise StorageOptionsError(
                f"unknown storage option {key!r} for s3://{hint}; accepted: "
                f"{', '.join(sorted(accepted))}. Credentials and the endpoint can also come "
                f"from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_ENDPOINT_URL")
    for key in ("client_kwargs", "config_kwargs", "s3_additional_kwargs"):
        if opts.get(key) is not None and not isinstance(opts[key], dict):
            raise StorageOptionsError(f"storage option {key!r} must be an object (a dict), "
                                      f"got {opts[key]!r}")


def _s3_filesystem(storage_options: dict[str, Any]):
    s3fs = require("s3fs", "s3")
    _check_s3_options(storage_options)
    opts = {k: v for k, v in storage_options.items()
            if k not in (RETRY_OPTION, s3_get.CLIENT_OPTION)}
    config = {**S3_CONFIG_DEFAULTS, **(opts.pop("config_kwargs", None) or {})}
    from aiobotocore.config import AioConfig

    try:
        AioConfig(**config)  # here, not at the first request deep inside botocore
    except (TypeError, ValueError) as exc:
        raise StorageOptionsError(
            f"storage option 'config_kwargs': {exc}; it takes botocore.config.Config fields "
            f"such as connect_timeout, read_timeout, retries, region_name") from None
    client_kwargs = opts.get("client_kwargs") or {}
    if not opts.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
        # botocore reads AWS_ENDPOINT_URL itself only in some versions; make it explicit.
        env_endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if env_endpoint:
            opts["endpoint_url"] = env_endpoint
    opts.pop("skip_instance_cache", None)
    opts.setdefault("use_listings_cache", False)
    # A private instance: fault tests and forked workers must not share a cached client.
    fs = s3fs.S3FileSystem(skip_instance_cache=True, config_kwargs=config, **opts)
    fs.retries = S3FS_RETRIES  # S3FileSystem(retries=...) is ignored; the attribute is not.
    # The session s3fs would make at its first request, made here with the process's botocore
    # data (see prepare_s3_for_fork): its client then skips re-reading botocore's JSON models.
    fs.session = _s3_session(fs.kwargs)
    return fs


# botocore's data loader of this process: every S3 client's session shares it, so the JSON
# models (the S3 API, endpoints, rule sets: ~0.2 s of CPU to parse) are read once per process,
# and a DataLoader worker forked after prepare_s3_for_fork() inherits them read.
_DATA_LOADER: Any = None


def _s3_session(session_kwargs: dict[str, Any]):
    from aiobotocore.session import AioSession

    global _DATA_LOADER
    session = AioSession(**session_kwargs)
    if _DATA_LOADER is None:
        _DATA_LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _DATA_LOADER)
    return session


_UNSET = object()
# The read path's GET clients of this process (io/s3_get.py), by their storage options; None
# where the options need s3fs, or a bucket's region turned out to be another (WrongRegion).
_LEAN: dict[str, Any] = {}
_LEAN_LOCK = threading.Lock()


def _options_key(storage_options: dict[str, Any]) -> str:
    return json.dumps(storage_options, sort_keys=True, default=repr)


def lean_client(storage_options: dict[str, Any]) -> s3_get.LeanS3 | None:
    """This process's :class:`~zephon_store.io.s3_get.LeanS3` for ``s3://`` reads with these
    storage options, made once (credentials resolved then); None where s3fs serves them
    (:func:`~zephon_store.io.s3_get.from_options`). Raises botocore's ``NoCredentialsError``
    when no credentials are configured anywhere."""
    key = _options_key(storage_options)
    with _LEAN_LOCK:
        if key in _LEAN:
            return _LEAN[key]
    client = s3_get.from_options(storage_options)
    with _LEAN_LOCK:
        return _LEAN.setdefault(key, client)


def _lean_off(storage_options: dict[str, Any], exc: BaseException) -> None:
    """Serve these options through s3fs from now on in this process (a bucket in another
    region than the configured one: botocore follows S3's redirect)."""
    _log.info("s3 reads go through s3fs from now on: %s", exc)
    with _LEAN_LOCK:
        _LEAN[_options_key(storage_options)] = None


def prepare_lean_for_fork(storage_options: dict[str, Any]) -> None:
    """Make the read path's GET client (imports, credentials) in this process before
    forking DataLoader workers, so that each inherits it ready: ~0.1 s once instead of
    per worker. Errors are left for the first request to report."""
    try:
        lean_client(storage_options)
    except Exception as exc:  # noqa: BLE001 - only a head start: the request reports it
        _log.debug("preparing the S3 GET client failed: %r", exc)


def prepare_s3_for_fork() -> None:
    """Import the S3 client stack and read botocore's S3 models in this process, so that
    processes forked from it (DataLoader workers) start their S3 client at once.

    A fresh process spends CPU before its first S3 request: importing the client stack,
    then parsing botocore's JSON models for a client. A rank that reads its metadata from
    the node cache never made a client, so each of its workers would pay that again, once
    per worker on one node's cores (the start benchmark, docs/benchmarks_start.md). Called
    once before forking, it costs that once.
    No request is made; without the ``s3`` extra it does nothing. Once per process: a later
    call returns at once, or waits for the one running (:func:`prepare_s3_for_fork_soon`).

    >>> prepare_s3_for_fork()
    """
    global _prepared
    with _PREPARE_LOCK:
        if _prepared:
            return
        try:
            import botocore.session
            import s3fs  # noqa: F401 - the import is the point: forked workers inherit it
        except ImportError:
            _prepared = True
            return
        # A client built offline reads the models into the shared loader (endpoint and keys
        # are placeholders: building a client sends nothing).
        session = _s3_session({})
        sync = botocore.session.Session()
        sync.register_component("data_loader", session.get_component("data_loader"))
        sync.create_client("s3", region_name="us-east-1", endpoint_url="http://127.0.0.1:9",
                           aws_access_key_id="warm", aws_secret_access_key="warm")
        _prepared = True


_PREPARE_LOCK = threading.Lock()
_prepared = False
_prepare_thread: threading.Thread | None = None


def prepare_s3_for_fork_soon() -> None:
    """Run :func:`prepare_s3_for_fork` in a thread now, and make every later fork of this
    process wait for it first (``os.register_at_fork``: a child never inherits a half-done
    import).

    A rank calls it as its loader starts, so the ~0.4 s of CPU overlaps the wait for the
    node's metadata, which one process fetches while the others are idle.
    """
    global _prepare_thread
    with _PREPARE_LOCK:
        if _prepared or _prepare_thread is not None:
            return
        _prepare_thread = threading.Thread(target=_prepare_quietly, daemon=True,
                                           name="zephon-s3-prepare")
        os.register_at_fork(before=_prepare_thread.join)
        _prepare_thread.start()


def _prepare_quietly() -> None:
    try:
        prepare_s3_for_fork()
    except Exception as exc:  # noqa: BLE001 - only a head start: the workers do it themselves
        _log.debug("preparing the S3 client stack failed: %r", exc)


def resolve(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """Return ``(fs, root_path)`` for a local path or URL.

    ``s3://`` uses s3fs (the ``s3`` extra) with credentials and endpoint from
    ``storage_options`` (``key``, ``secret``, ``token``, ``profile``, ``endpoint_url``,
    ``anon``, ``client_kwargs``, ``config_kwargs``) or the standard AWS environment
    (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``,
    ``AWS_ENDPOINT_URL``); a key s3fs does not take raises
    :class:`~zephon_store.errors.StorageOptionsError` naming it and the accepted ones. Other
    protocols go to ``fsspec.filesystem``. The ``"retry"`` key is zephon's own (see
    :func:`retry_policy`) and never reaches the filesystem.

    >>> fs, root = resolve("/tmp/ds")
    >>> root
    '/tmp/ds'
    """
    import fsspec
    import fsspec.core

    protocol, path = fsspec.core.split_protocol(url)
    opts = dict(storage_options or {})
    retry_policy(opts)  # a bad "retry" option fails here for every protocol
    if "::" in url:
        # A chained URL (simplecache::s3://b/k) is fsspec's to build; its options are keyed
        # by protocol ({"s3": {...}, "simplecache": {...}}).
        opts.pop(RETRY_OPTION, None)
        return fsspec.core.url_to_fs(url, **opts)
    if protocol in _LOCAL_PROTOCOLS:
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem(), os.path.abspath(os.path.expanduser(path)).rstrip("/") or "/"
    if protocol in ("s3", "s3a"):
        s3_get.check_client_option(opts)
        return _s3_filesystem(opts), path.strip("/")
    if protocol in GCS_PROTOCOLS:
        return object_store.store_for(opts, lambda o: f"gs {_options_key(o)}",
                                      gcs.from_options), path.strip("/")
    if protocol in AZURE_PROTOCOLS:
        root, account = _own_store_root(path)
        return object_store.store_for(
            opts, lambda o: f"az {account} {_options_key(o)}",
            lambda o: azure.from_options(o, host_account=account)), root
    opts.pop(RETRY_OPTION, None)
    opts.setdefault("skip_instance_cache", True)
    fs = fsspec.filesystem(protocol, **opts)
    return fs, fs._strip_protocol(url).rstrip("/")


def check_relpath(relpath: str, *, root: str = "", allow_empty: bool = False) -> str:
    """Return ``relpath`` if it stays inside the dataset root, else raise ``UnsafePathError``.

    >>> check_relpath("shards/ab.parquet")
    'shards/ab.parquet'
    >>> check_relpath("../etc/passwd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    zephon_store.errors.UnsafePathError: unsafe path '../etc/passwd' under the dataset root: ...
    """
    if not isinstance(relpath, str):
        raise TypeError(f"relpath must be a str, got {type(relpath).__name__}")
    if relpath == "" and allow_empty:
        return relpath
    parts = relpath.split("/")
    if (not relpath or relpath.startswith("/") or "\\" in relpath or "\x00" in relpath
            or _SCHEME_RE.match(relpath) or any(p in ("", ".", "..") for p in parts)):
        where = root or "the dataset root"
        raise UnsafePathError(
            f"unsafe path {relpath!r} under {where}: paths must be relative to the dataset "
            f"root, without '..', '.', empty parts, a leading '/' or a URL scheme")
    return relpath


class Storage:
    """One dataset root (local directory or ``s3://bucket/prefix``) and its files.

    Reads are retried per ``retry`` (a :class:`~zephon_store.io.retry.RetryPolicy`; default: the
    ``"retry"`` storage option, else ``RetryPolicy()``, a 60 s deadline) and, when an
    ``expected_xxh3`` is given, verified. ``throttle``: the node's shared request rate
    (:class:`~zephon_store.io.throttle.NodeThrottle`), waited on before every request and told
    of every throttled one (None: this process backs off alone). Picklable: a copy in another
    process opens its own filesystem client.

    >>> st = Storage("s3://bucket/ds", storage_options={"endpoint_url": "http://127.0.0.1:8333"})
    >>> st.url("manifest.json")
    's3://bucket/ds/manifest.json'
    """

    def __init__(self, root_url: str, *, storage_options: dict[str, Any] | None = None,
                 retry: RetryPolicy | None = None, throttle: NodeThrottle | None = None) -> None:
        if not isinstance(root_url, str) or not root_url:
            raise ValueError(f"root_url must be a non-empty str, got {root_url!r}")
        self.local = is_local_url(root_url)
        if self.local:
            root_url = os.path.abspath(os.path.expanduser(root_url.removeprefix("file://")))
        self.root_url = root_url.rstrip("/") or "/"
        self.storage_options = dict(storage_options or {})
        self.retry = retry if retry is not None else retry_policy(self.storage_options)
        self.throttle = throttle
        self.stats = StorageStats()
        self._lock = threading.Lock()
        self._fs: Any = None
        # The filesystem's own path of the root: known now for a local root (no fsspec),
        # set by ``fs`` on first use for a remote one.
        self._root_path = self.root_url if self.local else ""
        self._pid = -1
        self._lean_client: Any = _UNSET   # io/s3_get.py's client, looked up on first use

    # -- plumbing ---------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"root_url": self.root_url, "storage_options": self.storage_options,
                "retry": self.retry, "throttle": self.throttle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root_url"], storage_options=state["storage_options"],
                      retry=state["retry"], throttle=state.get("throttle"))

    def __repr__(self) -> str:
        return f"Storage({self.root_url!r})"

    @property
    def fs(self) -> Any:
        """The fsspec filesystem, created on first use in each process."""
        with self._lock:
            if self._fs is None or self._pid != os.getpid():
                self._fs, self._root_path = resolve(self.root_url, self.storage_options)
                self._pid = os.getpid()
            return self._fs

    def prepare_fork(self, *, soon: bool = False) -> None:
        """Before forking processes that will read this storage (DataLoader workers): for
        an ``s3://`` root, its GET client (:func:`prepare_lean_for_fork`) where the options
        allow one, else :func:`prepare_s3_for_fork` (``soon``: started in a thread,
        :func:`prepare_s3_for_fork_soon`); otherwise nothing."""
        if not self._is_s3():
            return
        if s3_get.lean_options(self.storage_options):
            if not soon:   # ~0.1 s: made when the workers are about to fork
                prepare_lean_for_fork(self.storage_options)
        else:
            (prepare_s3_for_fork_soon if soon else prepare_s3_for_fork)()

    def _is_s3(self) -> bool:
        return (not self.local and "::" not in self.root_url
                and self.root_url.split("://", 1)[0] in ("s3", "s3a"))

    def _is_gcs(self) -> bool:
        return (not self.local and "::" not in self.root_url
                and self.root_url.split("://", 1)[0] in GCS_PROTOCOLS)

    def _is_azure(self) -> bool:
        return (not self.local and "::" not in self.root_url
                and self.root_url.split("://", 1)[0] in AZURE_PROTOCOLS)

    def _lean(self) -> s3_get.LeanS3 | object_store.ObjectStore | None:
        """The GET client for this root's reads, or None: s3fs (or another fsspec
        filesystem) serves them. Looked up once per Storage (a forked copy shares it: the
        client opens its own connections in each process)."""
        if self._lean_client is _UNSET:
            if self._is_gcs() or self._is_azure():
                self._lean_client = self.fs
            else:
                self._lean_client = lean_client(self.storage_options) if self._is_s3() else None
        return self._lean_client

    def _get(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """One GET of a remote object, whole or ``[start, end)``: the lean client where it
        serves these options, else the filesystem."""
        lean = self._lean()
        if lean is not None:
            bucket, _, key = path.partition("/")
            try:
                return lean.get(bucket, key, start, end)
            except s3_get.WrongRegion as exc:
                _lean_off(self.storage_options, exc)
                self._lean_client = None
        if start is None:
            return _get_whole(self.fs, path)
        return self.fs.cat_file(path, start=start, end=end)

    def _path(self, relpath: str, *, allow_empty: bool = False) -> str:
        check_relpath(relpath, root=self.root_url, allow_empty=allow_empty)
        if not self.local and not self._root_path:
            # Local files are read with os calls, so a fresh process never imports fsspec
            # for a local dataset (docs/benchmarks.md); an s3:// root's path is known without
            # s3fs, which its reads may never need (io/s3_get.py).
            if self._is_s3() and s3_get.lean_options(self.storage_options):
                s3_get.connection_options(self.storage_options)   # bad values: here
                self._root_path = self.root_url.split("://", 1)[1].strip("/")
            elif self._is_gcs() or self._is_azure():
                (gcs if self._is_gcs() else azure).check_options(self.storage_options)
                self._root_path = _own_store_root(self.root_url.split("://", 1)[1])[0]
            else:
                fs = self.fs  # noqa: F841 - resolves _root_path
        if not relpath:
            return self._root_path
        return f"{self._root_path.rstrip('/')}/{relpath}"

    def url(self, relpath: str) -> str:
        """The full URL (or local path) of ``relpath``.

        >>> Storage("/data/ds").url("shards/x.parquet")
        '/data/ds/shards/x.parquet'
        """
        check_relpath(relpath, root=self.root_url, allow_empty=True)
        if not relpath:
            return self.root_url
        return f"{self.root_url.rstrip('/')}/{relpath}"

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for name, delta in deltas.items():
                setattr(self.stats, name, getattr(self.stats, name) + delta)

    def count_integrity_failures(self, n: int = 1) -> None:
        """Count ``n`` reads that failed their hash outside this object (a coalesced range
        split per row group is checked by its fetcher), so ``stats`` stays complete."""
        self._count(integrity_failures=n)

    def _call(self, fn: Callable[[], T], *, url: str, label: str, op: str,
              transient: Callable[[BaseException], bool] = is_transient,
              renewed: bool = False) -> T:
        """Run one storage operation with retries; map failures to zephon errors.

        ``transient`` says which failures are retried (default: the store's transient ones;
        reads add bytes that failed their hash). An ``s3://`` operation refused for
        credentials from the chain that were good once (rotated, revoked, expired) runs once
        more on a fresh client, which resolves the chain again (``renewed``: it did)."""
        throttle = None if self.local else self.throttle

        kind = _request_kind(op)
        backoff = ["retry"]   # the cause of the next back-off sleep (observe/causes.py)

        def attempt() -> T:
            if throttle is not None:
                with causes.timed("throttle"):
                    throttle.wait()   # the node is throttled: no process adds to it meanwhile
            self._count(requests=1)
            causes.count(kind)
            with causes.timed("fetch"), _IN_FLIGHT:
                return fn()

        def sleep(seconds: float) -> None:
            with causes.timed(backoff[0]):
                time.sleep(seconds)

        first = time.monotonic()
        warned = []

        def on_retry(attempts: int, exc: BaseException, _delay: float) -> None:
            self._count(retries=1)
            causes.count("retries")
            backoff[0] = "throttle" if is_throttle(exc) else "retry"
            if is_throttle(exc):
                causes.count("refusals")
            if throttle is not None and is_throttle(exc):
                throttle.report()
            # Retrying quietly for a minute looks like a hang; say so once per operation.
            elapsed = time.monotonic() - first
            if not warned and elapsed >= _WARN_RETRYING_AFTER_S:
                warned.append(True)
                _log.warning("%s %s: still retrying after %.0f s and %d attempts (last error "
                             "%s: %s); giving up %g s after the first attempt", op, url,
                             elapsed, attempts, type(exc).__name__, exc, self.retry.deadline)

        try:
            return call_with_retry(attempt, self.retry, what=f"{op} {url}", url=url,
                                   start=first, on_retry=on_retry, transient=transient,
                                   sleep=sleep)
        except ZephonError:
            raise
        except FileNotFoundError as exc:
            err = ShardNotFoundError(
                f"{label}: not found at {url} ({exc}); check the dataset URL, or run "
                f"'zephon verify {self.root_url}' to list what is missing")
            err.url = url  # type: ignore[attr-defined]
            raise err from exc
        except PermissionError as exc:
            if not renewed and self._renew_s3_client(exc):
                return self._call(fn, url=url, label=label, op=op, transient=transient,
                                  renewed=True)
            raise self._access_denied(url, op, exc) from exc
        except Exception as exc:
            names = {c.__name__ for c in type(exc).__mro__}
            if names & {"NoCredentialsError", "PartialCredentialsError"}:
                raise self._access_denied(url, op, exc) from exc
            if isinstance(exc, OSError) or names & {"BotoCoreError", "ClientError"}:
                raise StorageError(
                    f"{op} {url} failed: {type(exc).__name__}: {exc} (not retried: the error "
                    f"is permanent)") from exc
            raise

    def _renew_s3_client(self, exc: BaseException) -> bool:
        """Drop this root's s3fs client when ``exc`` refused credentials from the chain that
        were good once; True if it did (the next use makes a fresh one)."""
        opts = self.storage_options
        explicit = opts.get("key") or (opts.get("client_kwargs") or {}).get("aws_access_key_id")
        if not self._is_s3() or explicit or not is_stale_credentials(exc):
            return False
        with self._lock:
            self._fs = None
        return True

    def _access_denied(self, url: str, op: str, exc: BaseException) -> AccessDeniedError:
        if self.local:
            hint = "check the file permissions"
        elif self._is_gcs():
            hint = ("check credentials: storage_options token (a service-account file, "
                    "'anon') or GOOGLE_APPLICATION_CREDENTIALS, and the endpoint "
                    "(endpoint_url, STORAGE_EMULATOR_HOST)")
        elif self._is_azure():
            hint = ("check credentials: storage_options account_name with account_key, "
                    "sas_token or credential, or AZURE_STORAGE_CONNECTION_STRING, and the "
                    "endpoint (endpoint_url)")
        else:
            hint = ("check credentials: storage_options key/secret/profile or AWS_ACCESS_KEY_ID, "
                    "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, and the endpoint (AWS_ENDPOINT_URL)")
        return AccessDeniedError(f"access denied: {op} {url}: {type(exc).__name__}: {exc}; {hint}")

    # -- reads ------------------------------------------------------------------------------

    def _read_verified(self, fetch: Callable[[], bytes], *, url: str, label: str, op: str,
                       expected_xxh3: str | None, expected_len: int | None) -> bytes:
        """``fetch()`` until its bytes have the expected length and xxh3.

        Bytes that fail their hash (or the store's own checksum) are ridden out like a 5xx:
        fetched again after the retry policy's back-off with full jitter, within the same
        deadline as every other retry of this read, so ranks that saw one damaged response
        together do not re-read it together. Only when the deadline runs out with damaged
        bytes is the object called corrupt. A local file is read once: a mismatch on a
        disk is the stored bytes, not the way."""

        def attempt() -> bytes:
            try:
                data = fetch()
            except Exception as exc:
                if is_checksum_error(exc):
                    self._count(integrity_failures=1)
                raise
            self._count(bytes_fetched=len(data))
            causes.count("bytes." + _request_kind(op).partition(".")[2], len(data))
            length_ok = expected_len is None or len(data) == expected_len
            actual = xxh3_hex(data) if expected_xxh3 is not None else None
            if length_ok and actual == expected_xxh3:
                return data
            self._count(integrity_failures=1)
            raise _Damaged(actual, len(data))

        def damaged(exc: BaseException) -> bool:
            if isinstance(exc, _Damaged) or is_checksum_error(exc):
                return not self.local
            return is_transient(exc)

        first = time.monotonic()
        try:
            return self._call(attempt, url=url, label=label, op=op, transient=damaged)
        except _Damaged as exc:   # local: one read
            raise self._corrupt(exc, url=url, label=label, reads=1, elapsed=0.0,
                                expected_xxh3=expected_xxh3, expected_len=expected_len) from None
        except RetriesExhaustedError as exc:
            last = exc.last_error
            if isinstance(last, _Damaged) or (last is not None and is_checksum_error(last)):
                raise self._corrupt(last, url=url, label=label, reads=exc.attempts,
                                    elapsed=time.monotonic() - first,
                                    expected_xxh3=expected_xxh3,
                                    expected_len=expected_len) from last
            raise

    def _corrupt(self, exc: BaseException, *, url: str, label: str, reads: int, elapsed: float,
                 expected_xxh3: str | None, expected_len: int | None) -> StorageError:
        """The error for bytes that stayed damaged in every read of ``url``."""
        over = f"{reads} read{'s' if reads != 1 else ''}" + (
            f" over {elapsed:.1f} s" if reads > 1 else "")
        verify = f"Run 'zephon verify {self.root_url}' and re-convert"
        if not isinstance(exc, _Damaged):
            return IntegrityError(
                f"{label}: the response failed the storage's own checksum at {url} in each of "
                f"{over} ({type(exc).__name__}: {exc}); the stored object is damaged or "
                f"something on the way corrupts it. {verify} if it persists",
                url=url, expected=expected_xxh3)
        if expected_xxh3 is None:
            return StorageError(
                f"{label}: short read at {url}: got {exc.length} of {expected_len} bytes in "
                f"each of {over}; the object is smaller than the manifest says. {verify}")
        length_note = ("" if expected_len is None or exc.length == expected_len
                       else f", {exc.length} of {expected_len} bytes")
        return IntegrityError(
            f"{label}: xxh3 mismatch (expected {expected_xxh3}, got {exc.actual}{length_note}) "
            f"at {url} in each of {over}; the stored bytes are corrupt or were replaced. "
            f"{verify}", url=url, expected=expected_xxh3, actual=exc.actual)

    def read_range(self, relpath: str, start: int, end: int, *,
                   expected_xxh3: str | None = None, what: str = "") -> bytes:
        """Bytes ``[start, end)`` of ``relpath``: one ranged GET per attempt, verified.

        With ``expected_xxh3``, a mismatch is re-fetched (twice) and then raises
        :class:`~zephon_store.errors.IntegrityError` naming ``what`` (e.g. ``"shard 3f2a… row
        group 7"``), the URL and both hashes. A short read never passes silently.

        >>> st = Storage(tiny_dataset)
        >>> st.read_range(st.listdir("shards")[0], 0, 4, what="magic")   # Parquet's magic
        b'PAR1'
        """
        if start < 0 or end < start:
            raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
        path = self._path(relpath)
        url = self.url(relpath)

        def fetch() -> bytes:
            if start == end:
                return b""
            if self.local:
                return _pread(path, start, end)
            return self._get(path, start, end)

        return self._read_verified(fetch, url=url, label=what or relpath,
                                   op=f"GET bytes {start}-{end} of", expected_xxh3=expected_xxh3,
                                   expected_len=end - start)

    def read_file(self, relpath: str, *, expected_xxh3: str | None = None,
                  what: str = "") -> bytes:
        """The whole of ``relpath``, verified against ``expected_xxh3`` when given.

        >>> Storage(tiny_dataset).read_file("manifest.json")[:1]
        b'{'
        """
        path = self._path(relpath)
        url = self.url(relpath)

        def fetch() -> bytes:
            if self.local:
                return _read_all(path)
            return self._get(path)

        return self._read_verified(fetch, url=url, label=what or relpath, op="GET",
                                   expected_xxh3=expected_xxh3, expected_len=None)

    def exists(self, relpath: str) -> bool:
        """True if ``relpath`` exists (file or directory)."""
        path = self._path(relpath)
        if self.local:
            return os.path.exists(path)
        return self._call(lambda: bool(self.fs.exists(path)), url=self.url(relpath),
                          label=relpath, op="HEAD")

    def size(self, relpath: str) -> int:
        """Size of ``relpath`` in bytes; ``ShardNotFoundError`` if it is absent."""
        path = self._path(relpath)
        fn = (lambda: os.stat(path).st_size) if self.local else (lambda: int(self.fs.size(path)))
        return self._call(fn, url=self.url(relpath), label=relpath, op="HEAD")

    def listdir(self, relprefix: str = "") -> list[str]:
        """Sorted root-relative paths of the direct children of ``relprefix`` ([] if absent).

        >>> Storage(tiny_dataset).listdir("shards")
        ['shards/....parquet']
        """
        relprefix = relprefix.rstrip("/")
        path = self._path(relprefix, allow_empty=True)

        def ls() -> list[str]:
            try:
                if self.local:
                    return [os.path.join(path, n) for n in os.listdir(path)]
                return list(self.fs.ls(path, detail=False))
            except (FileNotFoundError, NotADirectoryError):
                return []

        names = self._call(ls, url=self.url(relprefix), label=relprefix or "root", op="LIST")
        base = self._root_path.rstrip("/") + "/"
        out = []
        for name in names:
            name = name.rstrip("/")
            if name.startswith(base) and name != path:
                out.append(name[len(base):])
        return sorted(out)

    def sizes(self, relprefix: str) -> dict[str, int]:
        """``{root-relative path: bytes}`` of the regular files directly under ``relprefix``
        ({} if absent). Folders, links and other special files are left out: one listing
        (paged on S3) instead of a HEAD per file.

        >>> len(Storage(tiny_dataset).sizes("shards"))   # tiny_dataset has one shard
        1
        """
        relprefix = relprefix.rstrip("/")
        path = self._path(relprefix)

        def ls() -> dict[str, int]:
            try:
                if self.local:
                    with os.scandir(path) as it:
                        return {e.path: e.stat(follow_symlinks=False).st_size for e in it
                                if e.is_file(follow_symlinks=False)}
                return {d["name"]: int(d["size"]) for d in self.fs.ls(path, detail=True)
                        if d.get("type") == "file"}
            except (FileNotFoundError, NotADirectoryError):
                return {}

        found = self._call(ls, url=self.url(relprefix), label=relprefix, op="LIST")
        base = self._root_path.rstrip("/") + "/"
        return {name[len(base):]: size for name, size in found.items()
                if name.startswith(base) and name.rstrip("/") != path}

    # -- conditional writes (object stores; the output lock's take-over and release) ---------

    def read_with_etag(self, relpath: str) -> tuple[bytes, str]:
        """``(data, etag)`` of an object; the ETag is read first, so a change in between makes a
        later ``If-Match`` on it fail rather than act on bytes it does not describe.
        Object stores only."""
        path = self._path(relpath)
        url = self.url(relpath)
        fs = self.fs
        tag = getattr(fs, "tag", None) or (lambda p: str(fs.info(p)["ETag"]))
        etag = self._call(lambda: tag(path), url=url, label=relpath, op="HEAD")
        return self.read_file(relpath), etag

    def replace_if_match(self, relpath: str, data: bytes, etag: str) -> bool:
        """Overwrite ``relpath`` only while it still has ``etag`` (``If-Match``); False when it
        changed or is gone. Object stores only (AWS S3 and SeaweedFS honour the header)."""
        return self._if_match("put_object", relpath, etag, Body=bytes(data))

    def delete_if_match(self, relpath: str, etag: str) -> bool:
        """Delete ``relpath`` only while it still has ``etag`` (``If-Match``); False when it
        changed or is gone. Object stores only."""
        return self._if_match("delete_object", relpath, etag)

    def _if_match(self, method: str, relpath: str, etag: str, **kwargs: Any) -> bool:
        if self.local:
            raise NotImplementedError("conditional writes are for object stores; local roots "
                                      "lock with flock")
        path = self._path(relpath)
        fs = self.fs
        op = {"put_object": "PUT", "delete_object": "DELETE"}[method] + " (if match)"
        if hasattr(fs, "replace_if_match"):
            # A store with its own conditional writes (GCS generations, Azure ETags).
            def own() -> bool:
                if method == "put_object":
                    return fs.replace_if_match(path, kwargs["Body"], etag)
                return fs.delete_if_match(path, etag)

            return self._call(own, url=self.url(relpath), label=relpath, op=op)
        bucket, key, _ = fs.split_path(path)

        def call() -> bool:
            try:
                fs.call_s3(method, Bucket=bucket, Key=key, IfMatch=etag, **kwargs)
                return True
            except FileNotFoundError:
                return False
            except OSError as exc:
                if _precondition_failed(exc):
                    return False
                raise

        return self._call(call, url=self.url(relpath), label=relpath, op=op)

    # -- writes -----------------------------------------------------------------------------

    def write_atomic(self, relpath: str, data: bytes | bytearray | memoryview) -> None:
        """Publish ``data`` at ``relpath`` all at once: readers see the old object or the new.

        Locally a temp file beside the target, fsync, ``os.replace``; on object stores one PUT
        (a multipart upload above 50 MiB, which is equally atomic).
        """
        path = self._path(relpath)
        url = self.url(relpath)
        if self.local:
            self._call(lambda: atomic_write(path, data), url=url, label=relpath,
                       op="write")
        else:
            self._call(lambda: self.fs.pipe_file(path, bytes(data)), url=url, label=relpath,
                       op="PUT")

    def write_file_from_local(self, relpath: str, local_path: str, *, move: bool = False) -> None:
        """Publish the local file ``local_path`` at ``relpath`` atomically.

        Locally: rename into place when ``move`` (copy + rename across devices), else copy to a
        temp file beside the target and rename. Object stores: one upload; with ``move`` the
        local file is removed after it succeeded.
        """
        path = self._path(relpath)
        url = self.url(relpath)
        if self.local:
            self._call(lambda: publish_file(local_path, path, move=move), url=url,
                       label=relpath, op="write")
            return
        self._call(lambda: self.fs.put_file(local_path, path), url=url, label=relpath, op="PUT")
        if move:
            os.unlink(local_path)

    def delete(self, relpath: str, *, missing_ok: bool = True) -> None:
        """Remove ``relpath``; a missing file is fine unless ``missing_ok=False``."""
        path = self._path(relpath)
        url = self.url(relpath)

        def rm() -> None:
            try:
                if self.local:
                    os.unlink(path)
                else:
                    self.fs.rm_file(path)
            except FileNotFoundError:
                if not missing_ok:
                    raise

        self._call(rm, url=url, label=relpath, op="DELETE")

    # -- exclusive create (the convert write path's output lock, zephon_store/write/lock.py) ---------

    def create_exclusive(self, relpath: str, data: bytes) -> bool:
        """Write ``data`` at ``relpath`` only if nothing is there; False if something is.

        Locally ``O_CREAT | O_EXCL``; on S3 one PUT with ``If-None-Match: *`` (AWS S3 and
        SeaweedFS answer 412 when the key exists). A store that ignores the header overwrites:
        callers that need certainty read the object back (zephon_store.write.lock does).
        """
        path = self._path(relpath)
        url = self.url(relpath)

        def create() -> bool:
            try:
                if self.local:
                    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                else:
                    self.fs.pipe_file(path, bytes(data), mode="create")
                return True
            except FileExistsError:
                return False
            except OSError as exc:
                if _precondition_failed(exc):
                    return False
                raise

        return self._call(create, url=url, label=relpath, op="PUT (if absent)")


def _get_whole(fs: Any, path: str) -> bytes:
    """A whole object in one request: one GET for S3, never a HEAD before it.

    ``S3FileSystem.cat_file`` of some s3fs versions first asks the size (a HEAD) and then
    splits the object into ranged GETs: two round trips for a manifest of a few KiB, and a
    retry repeats both. Other filesystems keep their own ``cat_file``.
    """
    call_s3 = getattr(fs, "_call_s3", None)
    if call_s3 is None or not hasattr(fs, "split_path"):
        return fs.cat_file(path)
    import fsspec.asyn

    bucket, key, version = fs.split_path(path)

    async def get() -> bytes:
        extra = {"VersionId": version} if version else {}
        resp = await call_s3("get_object", Bucket=bucket, Key=key, **extra,
                             **getattr(fs, "req_kw", {}))
        try:
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    return fsspec.asyn.sync(fs.loop, get)


def _precondition_failed(exc: BaseException) -> bool:
    """True for S3's 412 answer to ``If-None-Match: *`` (s3fs raises it as a plain OSError)."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        code = str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""
        if code in ("PreconditionFailed", "412") or "pre-conditions" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _open_regular(path: str) -> int:
    """A read-only descriptor of ``path``, which must be a regular file.

    O_NONBLOCK so a FIFO put in a dataset's place cannot block the open; the type is checked
    on the descriptor, so nothing can swap the file between the check and the read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StorageError(f"{path} is not a regular file (a FIFO, device, socket or "
                           "directory); a dataset holds regular files only: restore it from the "
                           "original or re-convert")
    return fd


def _read_all(path: str) -> bytes:
    with os.fdopen(_open_regular(path), "rb") as f:
        return f.read()


def _pread(path: str, start: int, end: int) -> bytes:
    fd = _open_regular(path)
    try:
        chunks = []
        pos = start
        while pos < end:
            chunk = os.pread(fd, end - pos, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
