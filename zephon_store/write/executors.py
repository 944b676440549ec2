"""Where the conversion's stages run: the executor seam.

Every stage of :func:`~zephon_store.write.convert.convert` (parse, count, pack, write) is a
module-level function over small picklable task descriptions; it reads its inputs from their
URLs and writes its results to the job's :class:`~zephon_store.write.staging.StagingArea` or
the output, and returns a small record. An executor only decides where those calls run:

``executor.map(fn, tasks, name="parse")`` returns an iterator of ``fn(task)`` in task order,
whatever order the tasks finish in. That is the whole contract, so the output is the same
byte for byte on any executor. ``shared_hosts`` says whether tasks may run on other hosts
(then the job stages beside the output, which every host reaches, instead of on this host).

- :class:`LocalExecutor` (the default): processes of this host, or threads for one worker;
- :class:`~zephon_store.write.ray_engine.RayExecutor`: Ray tasks on a Ray cluster.

:func:`~zephon_store.write.engines.make_executor` picks one by its engine's name.

A Dask ``distributed`` client would plug in the same way (``client.map(fn, tasks)`` then
``client.gather`` in order), and so would Spark (``sc.parallelize(tasks, len(tasks))
.map(fn).collect()`` keeps the order); see ``docs/scale.md``.

>>> with LocalExecutor(1, threads=1) as ex:
...     list(ex.map(abs, [-2, 3, -1], name="abs"))
[2, 3, 1]
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from typing import Any

__all__ = ["Executor", "LocalExecutor"]


class Executor:
    """The seam: run ``fn`` over ``tasks`` somewhere, results in task order.

    Subclasses implement :meth:`map` and may hold resources between ``__enter__`` and
    ``__exit__``. ``workers`` is how many tasks may run at once; ``shared_hosts`` is True
    when tasks may run on other hosts than the driver's.
    """

    workers: int = 1
    shared_hosts: bool = False

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        return None

    def map(self, fn: Callable[[Any], Any], tasks: Iterable[Any], *, name: str) -> Iterator[Any]:
        """``fn(task)`` for every task, yielded in task order; ``name`` labels the stage."""
        raise NotImplementedError


def _die_with_parent() -> None:
    """Pool worker initializer: exit when the converter dies, even by SIGKILL; ignore SIGINT.

    Otherwise a killed conversion leaves idle workers behind forever. Linux only (prctl
    PR_SET_PDEATHSIG); elsewhere the workers exit when their task queue closes. A terminal's
    Ctrl-C reaches the whole process group: the parent alone handles it (one line, exit 130)
    and stops the workers, which would otherwise each print a KeyboardInterrupt traceback.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except OSError:
            return
        if os.getppid() == 1:  # the parent already died before prctl took effect
            os._exit(1)


class LocalExecutor(Executor):
    """A process pool of this host, or threads of the current process when ``workers == 1``.

    With one worker, inputs are parsed and shards written by ``threads`` threads (default:
    two, or one on a one-core host): pyarrow parses JSON, compresses and writes without the
    GIL, so a second thread overlaps one shard's compression with the next one's (and one
    input's parse with the next), where one thread left the second core idle. Results come
    back in task order either way, so the output is the same byte for byte.
    """

    def __init__(self, workers: int = 1, *, threads: int | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.workers = workers
        self.threads = threads if threads is not None else min(2, os.cpu_count() or 1)
        self._ex = None

    def __enter__(self) -> LocalExecutor:
        if self.workers > 1:
            # spawn, not fork: forking a process that already runs pyarrow/fsspec threads can
            # deadlock.
            self._ex = ProcessPoolExecutor(self.workers, initializer=_die_with_parent,
                                           mp_context=multiprocessing.get_context("spawn"))
            self._start_workers()
        elif self.threads > 1:
            self._ex = ThreadPoolExecutor(self.threads, thread_name_prefix="zephon-convert")
        return self

    def _start_workers(self) -> None:
        """Start every worker now, with SIGINT ignored: the disposition survives fork + exec,
        so a Ctrl-C that lands while a worker is still importing cannot print its traceback
        (the initializer's own SIG_IGN comes only after the imports)."""
        import threading

        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for _ in range(self.workers):  # each submit without an idle worker spawns one
                self._ex.submit(int)
        finally:
            signal.signal(signal.SIGINT, previous)

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._ex is None:
            return
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt) and self.workers > 1:
            # Do not wait for running tasks (a large input can take minutes): stop now.
            processes = list((getattr(self._ex, "_processes", None) or {}).values())
            self._ex.shutdown(wait=False, cancel_futures=True)
            for p in processes:
                with contextlib.suppress(Exception):
                    p.kill()
            return
        self._ex.shutdown(cancel_futures=True)

    def map(self, fn, tasks, *, name: str = "") -> Iterator:
        if self._ex is None:
            return map(fn, tasks)
        return _interruptible_map(self._ex, fn, tasks)


# How long the main thread waits on a task at a time (see _interruptible_map).
_WAIT_SLICE_S = 0.25


def _interruptible_map(ex, fn, tasks) -> Iterator:
    """``ex.map(fn, tasks)`` (every task submitted at once, results in task order, the rest
    cancelled when the caller stops), waiting for each result in short slices.

    A Ctrl-C is a process signal: the kernel may hand it to any thread, and when that is
    not the main thread, a main thread blocked in ``Future.result()`` is not woken; Python
    raises ``KeyboardInterrupt`` only once the running task ends, minutes later for a large
    input (the pool's workers ignore SIGINT, so they go on). A wait that returns every
    ``_WAIT_SLICE_S`` lets the main thread see the signal at once.
    """
    futures = [ex.submit(fn, task) for task in tasks]   # at once, as Executor.map does
    return _in_order(futures)


def _in_order(futures: list) -> Iterator:
    try:
        for fut in futures:
            while not fut.done():
                wait([fut], timeout=_WAIT_SLICE_S)
            yield fut.result()
    finally:
        for fut in futures:
            fut.cancel()
