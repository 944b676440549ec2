"""Retries with exponential backoff and full jitter, bounded by attempts and a deadline.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from .errors import StorageError, ZephonError

T = TypeVar("T")

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
_TRANSIENT_S3_CODES = frozenset({
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
    "ThrottlingException", "500", "502", "503", "504",
})
_TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNREFUSED, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETRESET, errno.EBUSY, errno.EAGAIN,
    getattr(errno, "EREMOTEIO", 121),
})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient storage failure.

    Attempt ``k`` (1-based) that fails transiently is followed by a sleep drawn uniformly from
    ``[0, min(max_delay, base_delay * 2**(k-1))]`` ("full jitter"; without jitter the upper
    bound itself). No new attempt starts once ``deadline`` seconds have passed since the first,
    or when the next sleep would end past it; one attempt already running may still overshoot
    by its own timeout (the filesystem's read/connect timeout).

    >>> RetryPolicy(max_attempts=0)
    Traceback (most recent call last):
    ...
    ValueError: max_attempts must be >= 1, got 0
    """

    max_attempts: int = 6
    base_delay: float = 0.1
    max_delay: float = 5.0
    deadline: float = 60.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay < 0:
            raise ValueError(f"base_delay must be >= 0, got {self.base_delay}")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"max_delay must be >= base_delay ({self.base_delay}), got {self.max_delay}")
        if self.deadline <= 0:
            raise ValueError(f"deadline must be > 0, got {self.deadline}")

    def backoff(self, attempt: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to sleep after failed attempt number ``attempt`` (1-based).

        >>> RetryPolicy(base_delay=0.1, max_delay=1.0, jitter=False).backoff(3)
        0.4
        """
        cap = min(self.max_delay, self.base_delay * (2.0 ** (attempt - 1)))
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


def is_transient(exc: BaseException) -> bool:
    """True when retrying the operation that raised ``exc`` may succeed.

    Transient: connection reset/refused/closed, timeouts, HTTP 5xx and S3 ``SlowDown``,
    truncated bodies (aiohttp ``ClientPayloadError``, ``IncompleteRead``), botocore
    ``EndpointConnectionError``/``ReadTimeoutError``/``ConnectTimeoutError``. Permanent:
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
        if code in _TRANSIENT_S3_CODES or (status is not None and status >= 500):
            return True
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if any(c.__name__ in _TRANSIENT_CLASS_NAMES for c in type(e).__mro__):
            return True
        if type(e) in (OSError, IOError) and e.errno in _TRANSIENT_ERRNOS:
            return True
    return False


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rand: Callable[[], float] = random.random,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
    transient: Callable[[BaseException], bool] = is_transient,
) -> T:
    """Call ``fn()`` until it succeeds, retrying transient failures per ``policy``.

    Non-transient exceptions propagate unchanged on the first occurrence. When attempts or the
    deadline run out, raises :class:`~zephon_store.errors.StorageError` naming ``what`` (put the
    URL in it), the attempt count and the last error; the error carries ``attempts`` and
    ``last_error`` attributes and has the last error as ``__cause__``. ``on_retry(attempt, exc,
    delay)`` is called before each sleep (counters, logs). ``sleep``, ``clock`` and ``rand`` are
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
            delay = policy.backoff(attempt, rand)
            reason = None
            if attempt >= policy.max_attempts:
                reason = f"gave up after {attempt} attempts"
            elif elapsed + delay >= policy.deadline:
                reason = (f"gave up after {attempt} attempts: the {policy.deadline:g} s retry "
                          f"deadline would pass")
            if reason is not None:
                err = StorageError(
                    f"{what}: {reason} in {elapsed:.1f} s; last error: "
                    f"{type(exc).__name__}: {exc}. The storage is unreachable or failing; "
                    f"check the endpoint and network, or raise RetryPolicy(max_attempts=..., "
                    f"deadline=...)")
                err.attempts = attempt  # type: ignore[attr-defined]
                err.last_error = exc  # type: ignore[attr-defined]
                raise err from exc
            if on_retry is not None:
                on_retry(attempt, exc, delay)
            sleep(delay)
