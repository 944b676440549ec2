"""RetryPolicy / call_with_retry: the schedule is checked with a fake clock, never by waiting."""

from __future__ import annotations

import errno
import http.client

import pytest

from zephon_store.errors import (
    IntegrityError,
    RetriesExhaustedError,
    ShardNotFoundError,
    StorageError,
)
from zephon_store.io.retry import RetryPolicy, call_with_retry, is_checksum_error, is_transient


class FakeTime:
    """A clock that only moves when the code under test sleeps (plus optional work time)."""

    def __init__(self, work: float = 0.0) -> None:
        self.now = 100.0
        self.work = work
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def failing(exc_factory, succeed_on: int | None = None, clock: FakeTime | None = None):
    calls: list[int] = []

    def fn():
        calls.append(1)
        if clock is not None:
            clock.now += clock.work
        if succeed_on is not None and len(calls) >= succeed_on:
            return "ok"
        raise exc_factory()

    return fn, calls


def run(fn, policy: RetryPolicy, t: FakeTime, **kw):
    return call_with_retry(fn, policy, what="GET s3://b/k", sleep=t.sleep, clock=t.clock, **kw)


def test_exponential_schedule_without_jitter_is_exact():
    t = FakeTime()
    fn, calls = failing(ConnectionResetError, succeed_on=5)
    policy = RetryPolicy(max_attempts=6, base_delay=0.1, max_delay=0.5, jitter=False)
    assert run(fn, policy, t) == "ok"
    assert len(calls) == 5
    assert t.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.5])


def test_full_jitter_draws_below_the_exponential_cap():
    t = FakeTime()
    fn, _ = failing(TimeoutError, succeed_on=4)
    draws = iter([0.5, 0.25, 1.0])
    policy = RetryPolicy(base_delay=0.2, max_delay=10.0)
    run(fn, policy, t, rand=lambda: next(draws))
    assert t.sleeps == pytest.approx([0.2 * 0.5, 0.4 * 0.25, 0.8 * 1.0])


def test_gives_up_after_max_attempts_with_a_clear_error():
    t = FakeTime()
    fn, calls = failing(lambda: ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    policy = RetryPolicy(max_attempts=3, base_delay=0.1, jitter=False)
    with pytest.raises(StorageError) as info:
        run(fn, policy, t)
    assert len(calls) == 3
    assert len(t.sleeps) == 2  # no sleep after the last attempt
    err = info.value
    assert err.attempts == 3
    assert isinstance(err.last_error, ConnectionRefusedError)
    assert isinstance(err.__cause__, ConnectionRefusedError)
    msg = str(err)
    assert "s3://b/k" in msg and "3 attempts" in msg and "ConnectionRefusedError" in msg


def test_deadline_bounds_total_time_before_attempts_run_out():
    t = FakeTime(work=1.0)  # each attempt takes 1 s (e.g. a connect timeout)
    fn, calls = failing(TimeoutError, clock=t)
    policy = RetryPolicy(max_attempts=100, base_delay=1.0, max_delay=1.0, deadline=5.0,
                         jitter=False)
    with pytest.raises(StorageError, match="deadline"):
        run(fn, policy, t)
    # attempts at t=0,2,4 (1 s work + 1 s sleep); after the third, 5 s + 1 s sleep >= 5 s.
    assert len(calls) == 3
    assert t.now - 100.0 <= policy.deadline + t.work


@pytest.mark.parametrize("exc", [
    FileNotFoundError("no such key"),
    PermissionError("access denied"),
    ShardNotFoundError("gone"),
    IntegrityError("bad bytes"),
    ValueError("a bug"),
])
def test_permanent_errors_are_raised_at_once(exc):
    t = FakeTime()
    fn, calls = failing(lambda: exc)
    with pytest.raises(type(exc)):
        run(fn, RetryPolicy(), t)
    assert len(calls) == 1
    assert t.sleeps == []


def test_on_retry_sees_each_retry():
    t = FakeTime()
    seen = []
    fn, _ = failing(ConnectionResetError, succeed_on=3)
    run(fn, RetryPolicy(jitter=False), t, on_retry=lambda a, e, d: seen.append((a, type(e), d)))
    assert seen == [(1, ConnectionResetError, 0.1), (2, ConnectionResetError, 0.2)]


class ClientError(Exception):
    """Shaped like botocore's ClientError (matched by response, not by import)."""

    def __init__(self, code: str, status: int) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code},
                         "ResponseMetadata": {"HTTPStatusCode": status}}


def translated(exc_type, cause):
    """What s3fs raises: a built-in error whose __cause__ is the botocore error."""
    err = exc_type("translated")
    err.__cause__ = cause
    return err


class EndpointConnectionError(Exception):
    pass


class ReadTimeoutError(Exception):
    pass


class ClientPayloadError(Exception):
    pass


class BotoCoreError(Exception):
    pass


class FlexibleChecksumError(BotoCoreError):
    """Shaped like botocore's: the x-amz-checksum header does not match the body."""


@pytest.mark.parametrize("exc, expected", [
    (ConnectionResetError(), True),
    (ConnectionRefusedError(), True),
    (TimeoutError(), True),
    (http.client.IncompleteRead(b"abc", 10), True),
    (EndpointConnectionError(), True),
    (ReadTimeoutError(), True),
    (ClientPayloadError("Response payload is not completed"), True),
    (ClientError("SlowDown", 503), True),
    (ClientError("InternalError", 500), True),
    (translated(OSError, ClientError("SlowDown", 503)), True),
    (OSError(errno.EBUSY, "SlowDown"), True),
    (FlexibleChecksumError("Expected checksum 2/gV+g== did not match"), True),
    (translated(OSError, FlexibleChecksumError("Expected checksum")), True),
    (ClientError("BadDigest", 400), True),
    (ClientError("XAmzContentSHA256Mismatch", 400), True),
    (ClientError("AccessDenied", 403), False),
    (ClientError("NoSuchKey", 404), False),
    (translated(PermissionError, ClientError("SignatureDoesNotMatch", 403)), False),
    (translated(FileNotFoundError, ClientError("NoSuchKey", 404)), False),
    (FileNotFoundError(), False),
    (PermissionError(), False),
    (IntegrityError("x"), False),
    (ValueError("x"), False),
    (OSError(errno.EINVAL, "416 invalid range"), False),
])
def test_is_transient(exc, expected):
    assert is_transient(exc) is expected


def test_policy_validates_its_fields():
    with pytest.raises(ValueError, match=r"max_attempts must be >= 1 or None .*got 0"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="deadline must be > 0"):
        RetryPolicy(deadline=0)
    with pytest.raises(ValueError, match="max_delay"):
        RetryPolicy(base_delay=2.0, max_delay=1.0)


def test_the_default_policy_rides_out_a_minute_of_failures():
    """Regression (issue 14): the old default gave up after 6 attempts in ~1.5 s, so S3
    outages of 2, 5 and 20 s stopped the loader."""
    policy = RetryPolicy()
    assert policy.deadline >= 60 and policy.max_attempts is None and policy.jitter
    for outage in (2.0, 5.0, 20.0, 55.0):
        t = FakeTime(work=0.01)
        calls = []

        def fn(outage=outage, t=t, calls=calls):
            calls.append(1)
            t.now += t.work
            if t.now - 100.0 < outage:
                raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")
            return "ok"

        assert run(fn, policy, t) == "ok"
        # full jitter, capped: no sleep above max_delay, and service that came back is
        # noticed within one capped sleep
        assert max(t.sleeps) <= policy.max_delay
        assert t.now - 100.0 <= outage + policy.max_delay + t.work


def test_giving_up_names_url_attempts_and_elapsed_time():
    t = FakeTime(work=0.5)
    fn, calls = failing(TimeoutError, clock=t)
    with pytest.raises(RetriesExhaustedError) as info:
        call_with_retry(fn, RetryPolicy(), what="GET s3://b/ds/manifest.json",
                        url="s3://b/ds/manifest.json", sleep=t.sleep, clock=t.clock)
    err = info.value
    assert isinstance(err, StorageError) and isinstance(err, OSError)
    elapsed = t.now - 100.0
    assert RetryPolicy().deadline <= elapsed <= RetryPolicy().deadline + t.work
    assert err.attempts == len(calls) > 6 and err.elapsed == pytest.approx(elapsed)
    assert err.url == "s3://b/ds/manifest.json" and isinstance(err.last_error, TimeoutError)
    msg = str(err)
    assert "s3://b/ds/manifest.json" in msg and f"{len(calls)} attempts" in msg
    assert f"in {elapsed:.1f} s" in msg and "60 s retry deadline" in msg
    assert '"retry": {"deadline"' in msg   # says how to allow more time


def test_the_last_sleep_is_cut_to_the_deadline():
    t = FakeTime()
    fn, calls = failing(ConnectionResetError)
    policy = RetryPolicy(base_delay=1.0, max_delay=4.0, deadline=10.0, jitter=False)
    with pytest.raises(RetriesExhaustedError):
        run(fn, policy, t)
    # 1 + 2 + 4 = 7 s, then 3 s (not 4) to reach the deadline, one last attempt at 10 s
    assert t.sleeps == pytest.approx([1.0, 2.0, 4.0, 3.0])
    assert len(calls) == 5 and t.now - 100.0 == pytest.approx(10.0)


def test_steps_of_one_operation_share_one_deadline():
    t = FakeTime()
    fn, calls = failing(ConnectionResetError)
    policy = RetryPolicy(base_delay=1.0, max_delay=1.0, deadline=10.0, jitter=False)
    with pytest.raises(RetriesExhaustedError):
        run(fn, policy, t, start=t.now - 8.0)   # 8 s of the budget went to an earlier step
    assert len(calls) == 3 and t.now - 100.0 == pytest.approx(2.0)


def test_policy_from_plain_values():
    p = RetryPolicy.from_dict({"deadline": 300, "max_delay": 10, "max_attempts": None,
                               "jitter": False})
    assert p == RetryPolicy(deadline=300.0, max_delay=10.0, jitter=False)
    assert RetryPolicy.from_dict(p) is p
    with pytest.raises(ValueError, match=r"unknown retry option 'timeout'; accepted: .*deadline"):
        RetryPolicy.from_dict({"timeout": 3})
    with pytest.raises(ValueError, match="deadline must be a number of seconds"):
        RetryPolicy.from_dict({"deadline": "1m"})
    with pytest.raises(ValueError, match="max_attempts must be an integer or null"):
        RetryPolicy.from_dict({"max_attempts": 2.5})
    with pytest.raises(ValueError, match="deadline must be > 0"):
        RetryPolicy.from_dict({"deadline": 0})
    with pytest.raises(ValueError, match="JSON object"):
        RetryPolicy.from_dict([60])
    with pytest.raises(TypeError):
        RetryPolicy(60.0)  # keyword-only


def test_checksum_errors_are_recognised_through_the_cause_chain():
    assert is_checksum_error(translated(OSError, FlexibleChecksumError("x")))
    assert is_checksum_error(ClientError("BadDigest", 400))
    assert not is_checksum_error(ClientError("SlowDown", 503))
    assert not is_checksum_error(IntegrityError("xxh3 mismatch"))
