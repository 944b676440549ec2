"""One back-off per node when the object store throttles (503 SlowDown, 429).

An object store that answers ``SlowDown`` asks the *client* to slow down, and the client
of a training node is all of its processes together: 8 ranks x 2 workers that each back off
on their own keep the node's request rate where it was (each retries after its own short
delay), and the refusals multiply instead of the requests thinning out. So the processes
sharing a node cache folder share one small file, ``<cache>/v1/throttle``, saying until when
the node is throttled:

- a process answered ``SlowDown``/``429``/``503`` calls :meth:`NodeThrottle.report`: the
  node's level rises by one while throttles keep coming (it starts again at 1 once a
  pause and as long again have passed without one), and the node is paused for
  ``min(max_delay, base_delay * 2**(level-1))`` seconds from now (never shortened);
- every process calls :meth:`NodeThrottle.wait` before each request: while the node is
  paused it sleeps to the end of the pause plus a random part of one more pause (full
  jitter), so the waiting processes come back spread out, not all at once.

Requests made inside :func:`background` (the prefetch of later steps,
:mod:`zephon_store.io.prefetch`) yield to the others: they wait out the whole throttle
*episode*, the pause and as long again after it, so while the node is throttled the
requests a batch waits for now (the first step's, a reader's own) get the store's rate
first. A background wait ends after :data:`MAX_BACKGROUND_WAIT` seconds at most, so a
reader that waits for a background request is never held by it for longer.

A process's own retry schedule (:class:`~zephon_store.io.retry.RetryPolicy`) still bounds each
request; the shared pause only delays requests, it never adds attempts. When the folder
cannot be used (read-only, vanished) the throttle does nothing and each process backs off
alone, as before.

>>> t = NodeThrottle(tmp, base_delay=0.0, max_delay=0.0)
>>> t.report()
>>> t.wait()            # a zero pause: returns at once
0.0
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
import threading
import time
from collections.abc import Callable, Iterator

FILE_NAME = "throttle"
LAYOUT = "v1"   # the folder layout of io/cache.py: the file lives beside the cache's entries
# What a node pauses for after its first throttle, doubling per further throttle: S3 asks for
# exponential back-off starting in the ~100 ms range; 5 s caps it as RetryPolicy.max_delay does.
DEFAULT_BASE_DELAY = 0.2
DEFAULT_MAX_DELAY = 5.0
_WIDTH = 48   # the state is rewritten in place, one pwrite of a fixed width
# The longest a background request waits on the node's throttle episodes (seconds): a reader
# may be waiting for it (a prefetched range it needs), and the store may stay throttled.
MAX_BACKGROUND_WAIT = 10.0

_local = threading.local()


@contextlib.contextmanager
def background() -> Iterator[None]:
    """Requests this thread makes inside the block are background ones: they wait out the
    node's throttle episode, not only its pause (see the module docstring).

    >>> with background():
    ...     in_background()
    True
    >>> in_background()
    False
    """
    before = getattr(_local, "background", False)
    _local.background = True
    try:
        yield
    finally:
        _local.background = before


def in_background() -> bool:
    """Whether this thread is inside :func:`background`."""
    return getattr(_local, "background", False)


class NodeThrottle:
    """The shared "throttled until" of the processes using one node cache folder.

    ``directory`` is the cache folder (``ChunkCache.directory``); the state lives in
    ``<directory>/v1/throttle``. Picklable (a worker process gets its own handle).
    ``clock`` is wall time: every process of the node reads the same one.
    """

    def __init__(self, directory: str | os.PathLike[str], *,
                 base_delay: float = DEFAULT_BASE_DELAY, max_delay: float = DEFAULT_MAX_DELAY,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep,
                 rand: Callable[[], float] = random.random) -> None:
        if base_delay < 0 or max_delay < base_delay:
            raise ValueError(f"need 0 <= base_delay <= max_delay, got base_delay={base_delay}, "
                             f"max_delay={max_delay}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.path = os.path.join(self.directory, LAYOUT, FILE_NAME)
        self.base_delay = float(base_delay)
        self.max_delay = float(max_delay)
        self._clock, self._sleep, self._rand = clock, sleep, rand
        self.waited = 0.0     # seconds this handle slept in wait() (for tests and logs)
        self.reports = 0      # throttles this handle reported

    def __reduce__(self):
        return (NodeThrottle, (self.directory,),
                {"base_delay": self.base_delay, "max_delay": self.max_delay})

    def __setstate__(self, state: dict) -> None:
        self.base_delay, self.max_delay = state["base_delay"], state["max_delay"]

    def __repr__(self) -> str:
        return f"NodeThrottle({self.directory!r})"

    def pause_for(self, level: int) -> float:
        """The node's pause at throttle level ``level`` (1 after a first throttle).

        >>> NodeThrottle(tmp, base_delay=0.2, max_delay=5.0).pause_for(3)
        0.8
        """
        return min(self.max_delay, self.base_delay * 2.0 ** min(max(level, 1) - 1, 60))

    def state(self) -> tuple[float, int]:
        """``(until, level)``: the end of the node's pause (clock seconds; 0: never paused)
        and its level. A missing or unreadable file reads as ``(0.0, 0)``."""
        try:
            with open(self.path, "rb") as f:
                until, level = f.read(_WIDTH).split()
            return float(until), int(level)
        except (OSError, ValueError):
            return 0.0, 0

    def wait(self) -> float:
        """Sleep while the node is paused (to its end plus a jittered share of one pause);
        returns the seconds slept (0.0 when the node is not paused).

        In a :func:`background` block, sleep while the node is in a throttle episode (its
        pause and as long again after it, re-read after each sleep as other processes
        report), for :data:`MAX_BACKGROUND_WAIT` seconds at most.
        """
        slept = 0.0
        while True:
            until, level = self.state()
            end = until
            if level and in_background():
                end = until + self.pause_for(level)
            left = end - self._clock()
            if left <= 0:
                return slept
            delay = left + self._rand() * self.pause_for(level)
            if in_background():
                delay = min(delay, MAX_BACKGROUND_WAIT - slept)
            self._sleep(delay)
            self.waited += delay
            slept += delay
            if not in_background() or slept >= MAX_BACKGROUND_WAIT:
                return slept

    def report(self) -> None:
        """The store just throttled a request of this process: raise the node's level and
        pause the node (never shortening a pause already set)."""
        self.reports += 1
        with contextlib.suppress(OSError):   # no usable folder: each process backs off alone
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                until, level = _parse(os.pread(fd, _WIDTH, 0))
                now = self._clock()
                # Throttles within a pause and as long again after it are one episode.
                level = level + 1 if now < until + self.pause_for(level) else 1
                until = max(until, now + self.pause_for(level))
                os.pwrite(fd, f"{until:.6f} {level}".ljust(_WIDTH).encode(), 0)
            finally:
                os.close(fd)


def _parse(raw: bytes) -> tuple[float, int]:
    try:
        until, level = raw.split()
        return float(until), int(level)
    except ValueError:
        return 0.0, 0
