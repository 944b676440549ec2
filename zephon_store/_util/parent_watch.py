"""Worker processes that end with the process that started them.

A rank killed by its scheduler (SIGKILL, ``os._exit``, the OOM killer) runs no shutdown, so
its loader workers must notice on their own. torch's DataLoader checks its parent only while a
worker waits for the next index, and even a worker that noticed then hangs in its exit: the
multiprocessing finalizer joins the result queue's feeder thread, which blocks forever writing
a batch larger than the pipe's 64 KiB buffer into a pipe nobody reads (the sibling workers
hold its read end open, so the write never fails). Zephon's batches cross as pickled numpy
arrays, so every worker of a killed rank stayed alive (the start benchmark: 16 of 16 at
8 ranks x 2 workers). A worker whose main thread waits on a read (a slow or throttled S3
request, the node cache's per-object lock) never reaches torch's check at all. Grain's
process workers have no parent check: they stop only when told to.

:func:`exit_with_parent` covers all of it with one daemon thread per worker process that
polls the parent and ends the process with ``os._exit`` once it is gone: the worker holds
nothing that must be saved (workers hold no state; the cursor is the rank's), and
``os._exit`` skips the teardown that could block.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

from .process import process_alive

__all__ = ["exit_with_parent"]

# How often a worker looks for its parent: a dead rank's workers end within about this long
# (torch's own check runs every 5 s, and only while a worker is idle).
POLL_SECONDS = 0.5

_watching = False   # per process: a forked worker starts its own watch (threads do not fork)


def exit_with_parent(*_args: object, interval: float = POLL_SECONDS) -> None:
    """In a worker process: end it (``os._exit(0)``) soon after its parent is gone; once per
    process, later calls do nothing. Usable as a ``worker_init_fn`` (arguments ignored).

    "Gone": the process's parent id changed (the kernel reparents the orphan at once, before
    the dead parent is even reaped), or the process that created it through multiprocessing
    (the parent under fork and spawn, the rank behind a forkserver) is no longer running,
    which also covers a parent that died before this watch started.

    Callers: :class:`~zephon_store.torch.ZephonIterableDataset` (its ``worker_init_fn`` and
    ``__iter__``, so a DataLoader of your own over it gets the watch too) and Grain's
    workers (:mod:`zephon_store.grain.workers`).
    """
    global _watching
    if _watching:
        return
    _watching = True
    parent = os.getppid()
    creator = getattr(multiprocessing.parent_process(), "pid", None)

    def watch() -> None:
        while os.getppid() == parent and (creator is None or process_alive(creator)):
            time.sleep(interval)
        os._exit(0)

    threading.Thread(target=watch, name="zephon-parent-watch", daemon=True).start()
