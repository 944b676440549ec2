"""Where a conversion's time goes: seconds per kind of work, measured inside every task.

A conversion's phases (parse, cut, write, ...) each run many tasks, in threads, worker
processes or Ray tasks; their wall times (``ConvertResult.stages``) say which phase is long,
not why. Each task therefore times its own work by kind (:data:`WORK`) and returns the
seconds with its result; the driver sums them (``ConvertResult.work_seconds``). Summed over
tasks that ran at once, the total can exceed the wall time.

A task opens a :class:`StageTimes` with :meth:`StageTimes.active`; code it calls charges a
stretch of time to a kind with :func:`stage` without being handed the timer (the shard
writer, a tokenizer passed as ``parse_fn``), and outside a task :func:`stage` costs nothing.
Stages nest: a nested stage's time is taken out of the enclosing one, so a tokenizer
running inside the input's read loop is charged to ``tokenize``, not to ``read``.

>>> t = StageTimes()
>>> with t.active():
...     with stage("read"):
...         with stage("tokenize"):
...             pass
>>> sorted(t.seconds)
['read', 'tokenize']
>>> with stage("read"):   # no active timer in this thread: nothing is recorded
...     pass
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["WORK", "StageTimes", "stage"]

#: The kinds of work, in the order a conversion does them.
WORK = (
    "read",       # open and read the input, decompress, parse records (JSON, CSV, Parquet, text)
    "size",       # every row's size before compression (the cuts depend on it)
    "tokenize",   # packing: tokenize documents (inside the read loop)
    "pack",       # packing: cut token windows across inputs and stage them
    "stage",      # write the staged Arrow copy of the rows, and read it back to write a shard
    "encode",     # storage layout (byte planes), codec and dictionary choice per shard
    "compress",   # Parquet: encode pages, compress, write the shard's temp file
    "hash",       # xxh3 of the shard, each row group and the footer
    "write",      # publish the shard into the output (a rename locally, a PUT remotely)
    "publish",    # the manifest and its side tables (the driver, once)
)

_local = threading.local()


class StageTimes:
    """Seconds per kind of work of one task (or, merged, of a whole conversion)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._open: list[list[float]] = []   # [start, seconds of nested stages] per open stage

    @contextlib.contextmanager
    def active(self) -> Iterator[StageTimes]:
        """Make this the timer :func:`stage` charges in the current thread."""
        previous = getattr(_local, "times", None)
        _local.times = self
        try:
            yield self
        finally:
            _local.times = previous

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Charge the time inside the block to ``name``, less that of nested stages."""
        frame = [time.perf_counter(), 0.0]
        self._open.append(frame)
        try:
            yield
        finally:
            self._open.pop()
            elapsed = time.perf_counter() - frame[0]
            self.add(name, elapsed - frame[1])
            if self._open:
                self._open[-1][1] += elapsed

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to ``name``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def merge(self, seconds: dict[str, float]) -> None:
        """Add another task's :attr:`seconds`."""
        for name, s in seconds.items():
            self.add(name, s)

    def rounded(self) -> dict[str, float]:
        """The seconds in :data:`WORK` order (other names after), to the millisecond."""
        order = {name: i for i, name in enumerate(WORK)}
        names = sorted(self.seconds, key=lambda n: (order.get(n, len(order)), n))
        return {n: round(self.seconds[n], 3) for n in names}


def stage(name: str):
    """Charge a block to ``name`` on the current thread's active :class:`StageTimes`, if any."""
    times = getattr(_local, "times", None)
    return contextlib.nullcontext() if times is None else times.stage(name)

