"""Retries with exponential backoff and full jitter, bounded by a deadline (a time budget).

This is the one retry layer of zephon_store: the filesystems underneath (s3fs, botocore) are
configured to try once or twice, so the layers do not multiply and every retry is counted here.

>>> policy = RetryPolicy(max_attempts=3, base_delay=0.0)
>>> call_with_retry(lambda: 42, policy, what="answer")
42
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ..errors import RetriesExhaustedError, ZephonError

T = TypeVar("T")

# A minute: what docs/storage.md had promised, and three times the longest outage (20 s)
# that stopped a loader in the fault runs of issue 14. A job that must ride out longer
# outages says so (the "retry" storage option); failing later hides a dead endpoint longer.
DEFAULT_DEADLINE = 60.0

# Matched by name along each exception's MRO, so neither botocore nor aiohttp has to be
# importable (both come with the optional ``s3`` extra).
_TRANSIENT_CLASS_NAMES = frozenset({
    # botocore: HTTPClientError covers ConnectionClosedError, ReadTimeoutError,
    # ResponseStreamingError; ConnectionError covers EndpointConnectionError, ConnectTimeoutError.
    "HTTPClientError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "IncompleteReadError", "ResponseStreamingError",
    "ResponseParserError",
    # aiohttp: truncated bodies, dropped or refused connections, socket timeouts.
    "ClientPayloadError", "ServerDisconnectedError", "ClientConnectionError",
    "ClientOSError", "ServerTimeoutError",
    # stdlib http.client / urllib3 / fsspec.
    "IncompleteRead", "RemoteDisconnected", "ProtocolError", "FSTimeoutError",
})
_PERMANENT_CLASS_NAMES = frozenset({"NoCredentialsError", "PartialCredentialsError"})
# Bytes damaged between the store and us: botocore checks a whole-object GET against the
# x-amz-checksum-* header (FlexibleChecksumError); S3 rejects an upload whose body does not
# match its Content-MD5 or signed SHA-256. A re-send heals it, like an xxh3 mismatch.
_CHECKSUM_CLASS_NAMES = frozenset({"FlexibleChecksumError", "ChecksumMismatch"})
_CHECKSUM_S3_CODES = frozenset({"BadDigest", "XAmzContentSHA256Mismatch"})
# The store asking the client to slow down: retried, and reported to the node's shared
# request rate (io/throttle.py) so every process of the node slows down, not only this one.
_THROTTLE_S3_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "TooManyRequests", "RequestLimitExceeded",
    "ServiceUnavailable", "503", "429",
})
_THROTTLE_STATUSES = frozenset({429, 503})
_TRANSIENT_S3_CODES = frozenset({
    "InternalError", "RequestTimeout", "500", "502", "504", *_THROTTLE_S3_CODES,
    *_CHECKSUM_S3_CODES,
})
_TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET, errno.EBUSY, errno.EAGAIN,
    getattr(errno, "EREMOTEIO", 121),
})


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long to retry a transient storage failure: a time budget, not a count.

    Attempt ``k`` (1-based) that fails transiently is followed by a sleep drawn uniformly from
    ``[0, min(max_delay, base_delay * 2**(k-1))]`` ("full jitter", so ranks that failed together
    do not retry together; without jitter the upper bound itself), cut to what is left of the
    ``deadline``. Attempts go on until ``deadline`` seconds have passed since the first one
    (or ``max_attempts`` were made, if set); one attempt already running may overshoot by its
    own timeout (the filesystem's read/connect timeout).

    The defaults ride out an object-store outage of about a minute: ~25 attempts, at most
    ``max_delay`` apart, so service that comes back is noticed within seconds.

    >>> RetryPolicy(max_attempts=0)
    Traceback (most recent call last):
    ...
    ValueError: max_attempts must be >= 1 or None (no limit but the deadline), got 0
    """

    deadline: float = DEFAULT_DEADLINE
    base_delay: float = 0.1
    max_delay: float = 5.0
    max_attempts: int | None = None
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 or None (no limit but the deadline), "
                             f"got {self.max_attempts}")
        if self.base_delay < 0:
            raise ValueError(f"base_delay must be >= 0, got {self.base_delay}")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"max_delay must be >= base_delay ({self.base_delay}), got {self.max_delay}")
        if not self.deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {self.deadline}")

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> RetryPolicy:
        """A policy from plain values, e.g. the ``"retry"`` storage option given as JSON.

        >>> RetryPolicy.from_dict({"deadline": 300}).deadline
        300.0
        >>> RetryPolicy.from_dict({"timeout": 3})
        Traceback (most recent call last):
        ...
        ValueError: unknown retry option 'timeout'; accepted: base_delay, deadline, jitter, max_attempts, max_delay
        """
        if isinstance(options, RetryPolicy):
            return options
        if not isinstance(options, Mapping):
            raise ValueError(f"retry options must be a JSON object such as "
                             f'{{"deadline": 300}}, got {options!r}')
        accepted = sorted(f.name for f in fields(cls))
        out: dict[str, Any] = {}
        for name, value in options.items():
            if name not in accepted:
                raise ValueError(f"unknown retry option {name!r}; accepted: {', '.join(accepted)}")
            if name == "jitter":
                if not isinstance(value, bool):
                    raise ValueError(f"retry option jitter must be true or false, got {value!r}")
            elif name == "max_attempts":
                if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                    raise ValueError(f"retry option max_attempts must be an integer or null, "
                                     f"got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"retry option {name} must be a number of seconds, got {value!r}")
            else:
                value = float(value)
            out[name] = value
        return cls(**out)

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (1-based), before the cut
        to the deadline.

        >>> RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=False).backoff(3)
        0.4
        """
        cap = min(self.max_delay, self.base_delay * (2.0 ** min(attempt - 1, 60)))
        return cap * rand() if self.jitter else cap


def _chain(exc: BaseException):
    """``exc`` and its causes/contexts, each once (s3fs hides botocore errors in ``__cause__``)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        wrapped = getattr(e, "error", None)  # botocore ResponseStreamingError(error=...)
        todo += [e.__cause__, e.__context__,
                 wrapped if isinstance(wrapped, BaseException) else None]


def _s3_code(exc: BaseException) -> tuple[str | None, int | None]:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, None
    code = (response.get("Error") or {}).get("Code")
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return (str(code) if code is not None else None), status


def is_checksum_error(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) says the bytes failed the store's own checksum in
    transit: botocore ``FlexibleChecksumError``, S3 ``BadDigest``. Transient: re-fetch.

    >>> is_checksum_error(ValueError("x"))
    False
    """
    for e in _chain(exc):
        if any(c.__name__ in _CHECKSUM_CLASS_NAMES for c in type(e).__mro__):
            return True
        if _s3_code(e)[0] in _CHECKSUM_S3_CODES:
            return True
    return False


# The answers to credentials that were good once: expired, rotated or revoked. Permanent for
# the request that got one; a client that resolves its credentials again may succeed.
STALE_CREDENTIAL_CODES = frozenset({
    "ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired", "InvalidToken",
    "InvalidAccessKeyId", "SignatureDoesNotMatch",
})


def is_stale_credentials(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) is S3 refusing credentials that may have been
    rotated, revoked or expired since they were resolved (``InvalidAccessKeyId``,
    ``ExpiredToken``...).

    >>> is_stale_credentials(PermissionError("denied"))
    False
    """
    return any(_s3_code(e)[0] in STALE_CREDENTIAL_CODES for e in _chain(exc))


def is_throttle(exc: BaseException) -> bool:
    """True when ``exc`` (or its cause) is the store throttling: S3 ``SlowDown``, HTTP 429 or
    503 (``Throttling``, ``TooManyRequests``, ``ServiceUnavailable``). Transient too.

    >>> is_throttle(ConnectionResetError()), is_throttle(OSError("SlowDown: reduce your rate"))
    (False, True)
    """
    for e in _chain(exc):
        code, status = _s3_code(e)
        if code in _THROTTLE_S3_CODES or status in _THROTTLE_STATUSES:
            return True
        # s3fs turns some ClientErrors into a plain OSError carrying only the message.
        if type(e) in (OSError, IOError) and "SlowDown" in str(e):
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """True when retrying the operation that raised ``exc`` may succeed.

    Transient: connection reset/refused/closed, timeouts, HTTP 5xx and S3 ``SlowDown``,
    truncated bodies (aiohttp ``ClientPayloadError``, ``IncompleteRead``), botocore
    ``EndpointConnectionError``/``ReadTimeoutError``/``ConnectTimeoutError``, and bytes that
    failed the store's checksum in transit (:func:`is_checksum_error`). Permanent:
    missing objects (404, ``FileNotFoundError``), denied access (403, ``PermissionError``),
    missing credentials, and every :class:`~zephon_store.errors.ZephonError`.

    >>> is_transient(ConnectionResetError()), is_transient(FileNotFoundError("x"))
    (True, False)
    """
    chain = list(_chain(exc))
    # A permanent verdict anywhere in the chain wins: s3fs turns a 403 ClientError into a
    # PermissionError whose cause is the ClientError.
    for e in chain:
        if isinstance(e, (FileNotFoundError, PermissionError, NotADirectoryError,
                          IsADirectoryError, ZephonError)):
            return False
        if any(c.__name__ in _PERMANENT_CLASS_NAMES for c in type(e).__mro__):
            return False
        code, status = _s3_code(e)
        if status in (401, 403, 404) or code in ("NoSuchKey", "NoSuchBucket", "AccessDenied",
                                                  "SignatureDoesNotMatch",
                                                  "InvalidAccessKeyId"):
            return False
    for e in chain:
        code, status = _s3_code(e)
        if (code in _TRANSIENT_S3_CODES or status in _THROTTLE_STATUSES
                or (status is not None and status >= 500)):
            return True
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if any(c.__name__ in _TRANSIENT_CLASS_NAMES | _CHECKSUM_CLASS_NAMES
               for c in type(e).__mro__):
            return True
        if type(e) in (OSError, IOError) and (e.errno in _TRANSIENT_ERRNOS
                                               or "SlowDown" in str(e)):
            return True
    return False


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    url: str | None = None,
    start: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    transient: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Call ``fn()`` until it succeeds, retrying transient failures per ``policy``.

    Non-transient exceptions propagate unchanged on the first occurrence. When the deadline
    (or ``max_attempts``) runs out, raises
    :class:`~zephon_store.errors.RetriesExhaustedError` (a ``StorageError``) naming ``what``
    (put the URL in it), the attempts made, the seconds elapsed and the last error; it carries
    ``url``, ``attempts``, ``elapsed`` and ``last_error`` and has the last error as
    ``__cause__``. ``start`` is the ``clock()`` value the logical operation began at (default:
    now), so steps of one operation share one deadline. ``on_retry(attempt, exc, delay)`` is
    called before each sleep (counters, logs). ``sleep``, ``clock`` and ``rand`` are
    injectable so tests can check the schedule without waiting.

    >>> calls = []
    >>> def flaky():
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionResetError("peer reset")
    ...     return "ok"
    >>> call_with_retry(flaky, RetryPolicy(jitter=False), what="GET s3://b/k", sleep=lambda s: None)
    'ok'
    """
    if start is None:
        start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not transient(exc):
                raise
            elapsed = clock() - start
            left = policy.deadline - elapsed
            if left <= 0 or (policy.max_attempts is not None
                             and attempt >= policy.max_attempts):
                raise _exhausted(what, url, policy, attempt, elapsed, exc) from exc
            delay = min(policy.backoff(attempt, rand), left)
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)


def _exhausted(what: str, url: str | None, policy: RetryPolicy, attempts: int, elapsed: float,
               exc: BaseException) -> RetriesExhaustedError:
    budget = (f"the {policy.deadline:g} s retry deadline" if elapsed >= policy.deadline else
              f"max_attempts={policy.max_attempts}")
    return RetriesExhaustedError(
        f"{what}: gave up after {attempts} attempt{'s' if attempts != 1 else ''} in "
        f"{elapsed:.1f} s ({budget} ran out); last "
        f"error: {type(exc).__name__}: {exc}. The storage is unreachable or failing: check the "
        f"endpoint and network, or allow more time with the storage option "
        f'{{"retry": {{"deadline": SECONDS}}}} (or open_dataset(..., retry=RetryPolicy('
        f"deadline=...)))", url=url, attempts=attempts, elapsed=elapsed, last_error=exc)
