"""Workers as a part: who makes a share's batches, handed to the loader.

A :class:`~zephon_store.load.loader.Loader` reads its batches through one *workers part*:
:class:`Threads` (this process: the decode-ahead pipeline, and a producer thread when there
is a transform), or a part whose process workers make them: torch's DataLoader
(:class:`~zephon_store.torch.loader.TorchProcesses`) or Grain's
(:class:`~zephon_store.grain.iter_dataset.GrainProcesses`). Each carries its
:class:`~zephon_store.load.options.WorkerOptions`; a process part with ``num_workers=0``
makes its batches with threads, so the batches are the same whichever part a front end
hands over.

>>> Threads().options.num_workers, as_workers(None).options.prefetch
(0, 4)
>>> as_workers(WorkerOptions(num_workers=2))
Traceback (most recent call last):
...
ValueError: process workers (num_workers > 0) need torch's DataLoader: use zephon_store.torch.ZephonLoader (LiveZephonLoader for a live run)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from time import perf_counter
from typing import Protocol, runtime_checkable

from ..observe import causes
from .options import WorkerOptions
from .share_reader import ShareReader

__all__ = ["ProcessWorkers", "Threads", "Workers", "as_workers", "thread_batches",
           "threaded_batches"]


@runtime_checkable
class Workers(Protocol):
    """Makes the ``(i, batch)`` of a share, in order (``options``: how many, how far ahead)."""

    options: WorkerOptions

    def batches(self, reader: ShareReader) -> Iterator[tuple[int, dict]]: ...


def thread_batches(reader: ShareReader, prefetch: int) -> Iterator[tuple[int, dict]]:
    """The reader's batches made in this process.

    The pipeline decodes ahead in its own pool; remote datasets also fetch bytes ahead into
    the disk cache (the prefetcher). Without a transform the batches are cut in the loop's
    thread: a numpy slice or gather (token windows, numbers) or one str per document (text),
    cheaper than handing each batch over from a thread (docs/benchmarks.md). A transform
    (tokenizing, say) can be heavy, so it runs in one producer thread up to ``prefetch``
    batches ahead.
    """
    if reader.batch.transform is None:
        yield from reader.batches()
        return
    yield from threaded_batches(reader, prefetch)


class Threads:
    """The part that makes batches in this process (:func:`thread_batches`)."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()
        if self.options.num_workers:
            raise ValueError("process workers (num_workers > 0) need torch's DataLoader: use "
                             "zephon_store.torch.ZephonLoader (LiveZephonLoader for a live "
                             "run)")

    def batches(self, reader: ShareReader) -> Iterator[tuple[int, dict]]:
        return thread_batches(reader, self.options.prefetch)


class ProcessWorkers:
    """The base of a part whose process workers make the batches: with ``num_workers=0``
    they are made by threads, as :class:`Threads` does; otherwise the reader readies what
    forked workers inherit, once, and :meth:`processes` makes them."""

    def __init__(self, options: WorkerOptions | None = None) -> None:
        self.options = options or WorkerOptions()

    def batches(self, reader: ShareReader) -> Iterator[tuple[int, dict]]:
        if not self.options.num_workers:
            return thread_batches(reader, self.options.prefetch)
        # Once here, not once per (forked) worker process.
        reader.prepare_workers(self.options.multiprocessing_context)
        return self.processes(reader)

    def processes(self, reader: ShareReader) -> Iterator[tuple[int, dict]]:
        raise NotImplementedError


def as_workers(workers) -> Workers:
    """The part ``workers`` names: a part as it is, or :class:`Threads` of a
    :class:`WorkerOptions` (None: the defaults); process workers need a front end that
    brings them."""
    if isinstance(workers, Workers):
        return workers
    return Threads(workers)


def threaded_batches(reader: ShareReader, prefetch: int) -> Iterator[tuple[int, dict]]:
    """The reader's ``(i, batch)``, made by one producer thread up to ``prefetch`` batches
    ahead of the consumer (the transform runs there), with a remote source's bytes fetched
    ahead; closing the iterator never waits for a decode."""
    pre = reader.prefetcher() if reader.dataset.cache is not None else None
    ready: queue.Queue = queue.Queue(maxsize=prefetch)
    stop = threading.Event()

    def offer(item) -> bool:
        """Put ``item`` in the queue; False once the consumer has gone."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    pipeline = reader.pipeline(stop=stop)

    def produce() -> None:
        try:
            items = iter(pipeline)
            while True:
                # Each batch goes with this thread's account of it (observe/causes.py).
                with causes.collect() as tally:
                    item = next(items, _DONE)
                if item is _DONE:
                    break
                if not offer((item, tally)):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            offer(_Failed(exc))
            return
        offer(_DONE)

    producer = threading.Thread(target=produce, name="zephon-batches", daemon=True)
    producer.start()
    try:
        while True:
            t0 = perf_counter()
            got = ready.get()
            if got is _DONE:
                return
            if isinstance(got, _Failed):
                raise got.exc
            item, tally = got
            causes.waited(perf_counter() - t0, tally)
            if pre is not None:
                pre.consumed(item[0])
            yield item
    finally:
        # Not joined: the producer sees `stop` at its next step (at most one row-group
        # decode away) and ends the pipeline, whose decodes are cancelled; closing an
        # iterator never waits for a decode.
        pipeline.cancel()
        try:
            while True:
                ready.get_nowait()   # a producer blocked on a full queue wakes up
        except queue.Empty:
            pass
        if pre is not None:
            pre.close()


_DONE = object()


class _Failed:
    """An exception raised by the producer thread, to be raised in the consumer's."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

