"""Where a thread's time goes, by cause, and the process's counters: the cheap, always-on
recorder under the per-step account (:mod:`.account`).

A *tally* collects seconds per cause for one job (a row group's decode, a step's ``next()``).
Code marks what it is doing with :func:`timed`; nested marks are exclusive (a fetch inside a
decode counts as fetch, not also as decode). A job that waits for another job (a decode
running in a pool thread, a batch made in a worker process) adds the seconds it waited to
its own tally *in the proportions of the other job's tally* (:func:`waited`): the waiting
thread cannot see the other thread's causes, but that job's account says where its time
went. Without an active tally (:func:`collect`) a mark costs two ``perf_counter`` calls and
a thread-local lookup.

>>> with collect() as t:
...     with timed("decode"):
...         with timed("fetch"):
...             pass
>>> sorted(k for k, v in t.as_dict().items() if v >= 0)[:2]
['blank', 'cache_lock']
>>> count("requests.get_range", 2); counters()["requests.get_range"] >= 2
True
"""

from __future__ import annotations

import struct
import threading
from time import perf_counter

__all__ = ["CAUSES", "Tally", "activate", "collect", "count", "counters", "current", "gauge",
           "restore", "timed", "waited", "waiting_on"]

# Why a step waited. fetch: a storage request on the wire (S3 latency); throttle: waiting
# for the node's send slot or backing off after a 503 SlowDown; retry: backing off after any
# other transient failure; cache_lock: waiting for another process or thread of the node to
# publish a row group (disk cache) or its decoded table (decoded cache); decode: Parquet
# decode and hash checks; blank: deny-list blanking; transform: the user's transform;
# collate: the front end's collation; handover: a worker process's batch in transit (queue,
# pickle); other: planning and cutting batches, what none of the above covers.
CAUSES = ("fetch", "throttle", "retry", "cache_lock", "decode", "blank", "transform",
          "collate", "handover", "other")
_INDEX = {c: i for i, c in enumerate(CAUSES)}

_local = threading.local()
_counts: dict[str, float] = {}
_counts_lock = threading.Lock()


class Tally:
    """Seconds per cause of one job (see the module docstring)."""

    __slots__ = ("seconds",)

    def __init__(self, seconds=None) -> None:
        self.seconds = list(seconds) if seconds is not None else [0.0] * len(CAUSES)

    def add(self, cause: str, seconds: float) -> None:
        self.seconds[_INDEX[cause]] += seconds

    def total(self) -> float:
        return sum(self.seconds)

    def merge(self, other: Tally, scale: float = 1.0) -> None:
        """Add ``other``'s seconds, each times ``scale``."""
        s = self.seconds
        for i, v in enumerate(other.seconds):
            if v:
                s[i] += v * scale

    def as_dict(self) -> dict[str, float]:
        return dict(zip(CAUSES, self.seconds))

    def encode(self) -> bytes:
        """The seconds as bytes, for another process (a cache lock's note)."""
        return struct.pack(_FORMAT, *self.seconds)

    @classmethod
    def decode(cls, raw: bytes) -> Tally | None:
        """A tally from :meth:`encode`'s bytes; None for anything else."""
        if len(raw) != struct.calcsize(_FORMAT):
            return None
        values = struct.unpack(_FORMAT, raw)
        if not all(0 <= v < _MAX_SECONDS for v in values):   # NaN too
            return None
        return cls(values)


_FORMAT = f"<{len(CAUSES)}d"
# More seconds than a job takes: the bytes are not a tally (a lock file's leftovers).
_MAX_SECONDS = 1e7


def current() -> Tally | None:
    """This thread's active tally (inside :func:`collect`), or None."""
    return getattr(_local, "tally", None)


def activate(tally: Tally) -> tuple:
    """Make ``tally`` this thread's active one (a long-lived tally that adds up many jobs,
    cheaper per job than :func:`collect`); returns what :func:`restore` puts back."""
    saved = (getattr(_local, "tally", None), getattr(_local, "frames", None))
    _local.tally, _local.frames = tally, []
    return saved


def restore(saved: tuple) -> None:
    """Undo :func:`activate`."""
    _local.tally, _local.frames = saved


class _Collect:
    __slots__ = ("tally", "_saved", "_t0")

    def __enter__(self) -> Tally:
        self._saved = (getattr(_local, "tally", None), getattr(_local, "frames", None))
        _local.tally, _local.frames = Tally(), []
        self.tally = _local.tally
        self._t0 = perf_counter()
        return self.tally

    def __exit__(self, *exc) -> None:
        outer, frames = self._saved
        _local.tally, _local.frames = outer, frames
        if outer is not None:
            # A job run inside another (the first step's decode in the loop's thread) is
            # part of that one's time.
            outer.merge(self.tally)
            if frames:
                frames[-1][2] += perf_counter() - self._t0


def collect() -> _Collect:
    """``with collect() as tally:`` the causes of this thread's time inside the block; a
    collect nested in another adds its tally to the outer one at its end."""
    return _Collect()


class _Timed:
    __slots__ = ("index", "frame")

    def __init__(self, cause: str) -> None:
        self.index = _INDEX[cause]

    def __enter__(self) -> None:
        frames = getattr(_local, "frames", None)
        self.frame = None
        if frames is not None:
            self.frame = [self.index, perf_counter(), 0.0]
            frames.append(self.frame)

    def __exit__(self, *exc) -> None:
        frame = self.frame
        if frame is None:
            return
        frames = _local.frames
        elapsed = perf_counter() - frame[1]
        if frames and frames[-1] is frame:
            frames.pop()
        _local.tally.seconds[frame[0]] += max(0.0, elapsed - frame[2])
        if frames:
            frames[-1][2] += elapsed


def timed(cause: str) -> _Timed:
    """``with timed("fetch"):`` count the block's own time (less nested marks) as ``cause``."""
    return _Timed(cause)


def waited(seconds: float, of: Tally | None, fallback: str = "other") -> None:
    """This thread waited ``seconds`` for a job whose tally is ``of``: add them in ``of``'s
    proportions (all to ``fallback`` when ``of`` is empty)."""
    tally = getattr(_local, "tally", None)
    if tally is None or seconds <= 0:
        return
    total = of.total() if of is not None else 0.0
    if total > 0:
        tally.merge(of, seconds / total)
    else:
        tally.add(fallback, seconds)
    frames = _local.frames
    if frames:
        frames[-1][2] += seconds


class _WaitingOn:
    __slots__ = ("get", "fallback", "t0")

    def __init__(self, get, fallback: str) -> None:
        self.get, self.fallback = get, fallback

    def __enter__(self) -> None:
        self.t0 = perf_counter()

    def __exit__(self, *exc) -> None:
        waited(perf_counter() - self.t0, self.get(), self.fallback)


def waiting_on(get_tally, fallback: str = "other") -> _WaitingOn:
    """``with waiting_on(lambda: job.tally, "fetch"):`` the block waits for that job; its
    time is :func:`waited` in the job's proportions, read at the block's end."""
    return _WaitingOn(get_tally, fallback)


def count(name: str, n: float = 1) -> None:
    """Add ``n`` to the process's counter ``name`` (``requests.get_range``, ``bytes.get``,
    ``retries``, ``refusals``, ``cache_hits``, ...)."""
    with _counts_lock:
        _counts[name] = _counts.get(name, 0) + n


def gauge(name: str, value: float) -> None:
    """Set the process's gauge ``name`` (its last value; ``prefetch_lead_steps``)."""
    _counts["gauge." + name] = value


def counters() -> dict[str, float]:
    """A copy of the process's counters and gauges (gauges named ``gauge.NAME``)."""
    with _counts_lock:
        return dict(_counts)
