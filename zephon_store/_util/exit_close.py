"""Close iterators still open at interpreter exit, while every module is still whole.

A generator left open (``batches = iter(loader); next(batches)`` at the end of a script) is
otherwise closed by the garbage collector during module teardown, after the standard
library's module globals are set to None: its ``finally`` (stopping a thread pool, draining
a queue) then fails inside the standard library and Python prints
``Exception ignored in: <generator ...> ... 'NoneType' object has no attribute 'Empty'``.
An :mod:`atexit` hook runs before that teardown, so the same ``finally`` runs cleanly there.

>>> def gen():
...     yield 1
>>> it = close_at_exit(gen())
>>> next(it)
1
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Generator
from typing import TypeVar

__all__ = ["close_at_exit"]

G = TypeVar("G", bound=Generator)

# Weak: registering must never keep an iterator (and the row groups it holds) alive.
_open: weakref.WeakSet = weakref.WeakSet()
_lock = threading.Lock()


def close_at_exit(gen: G) -> G:
    """Register ``gen`` to be closed at interpreter exit if it is still open; return it."""
    with _lock:
        _open.add(gen)
    return gen


@atexit.register
def _close_open() -> None:
    with _lock:
        gens = list(_open)
        _open.clear()
    for gen in gens:
        try:
            gen.close()
        except Exception:  # noqa: BLE001 - running in another thread, or its own error:
            # exiting must not fail on an iterator the program had abandoned.
            pass
