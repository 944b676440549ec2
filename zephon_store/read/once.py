"""One computation per key at a time: threads asking for the same key wait for the one run.

>>> once = OncePerKey()
>>> once.run(3, lambda k: k * 2)
6
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class OncePerKey(Generic[T]):
    """De-duplicates concurrent computations of the same key (results are not kept)."""

    def __init__(self) -> None:
        self._inflight: dict[int, Future] = {}
        self._lock = threading.Lock()

    def after_fork(self) -> None:
        """In a forked child: the runs in flight belonged to threads that did not survive."""
        self._inflight = {}
        self._lock = threading.Lock()

    def run(self, key: int, compute: Callable[[int], T],
            done: Callable[[int], T | None] | None = None) -> T:
        """``compute(key)``, or the result of the run of ``key`` already in flight.

        ``done(key)``, checked under the lock, returns a result stored meanwhile (a run may
        have finished between the caller's own look-up and this call), or None.
        """
        with self._lock:
            if done is not None:
                got = done(key)
                if got is not None:
                    return got
            fut = self._inflight.get(key)
            owner = fut is None
            if owner:
                fut = self._inflight[key] = Future()
        if not owner:
            return fut.result()
        try:
            got = compute(key)
            fut.set_result(got)
            return got
        except BaseException as exc:
            fut.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)
