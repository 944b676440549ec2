"""One share's batches, wired once: rank stream + decode-ahead pipeline + byte prefetch.

A *share* is what one process makes: a rank's batches, or one DataLoader worker's part of
them. :class:`ShareReader` builds the rank stream once and hands out, for a share, its
pipeline (row groups decoded ahead, batches cut in order) and, for a remote dataset, its
prefetcher (bytes fetched ahead into the disk cache). The torch loader, its
``IterableDataset`` and the TorchTitan loader are thin shells over it; nothing here imports
torch.

>>> from zephon_store import open_dataset
>>> reader = ShareReader(open_dataset(tiny_dataset), OrderOptions(seed=7), Topology(8, 2, 0),
...                      num_batches=2)
>>> for i, batch in reader.batches():
...     i, batch["id"].tolist(), batch["text"][0]
(0, [79, 41, 78, 45], 'record 79')
(1, [49, 5, 87, 4], 'record 49')
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

from ..io.prefetch import Prefetcher
from ..io.storage import Storage
from ..order.assign import batches_for_worker, step_cursor
from ..order.order import OrderOptions
from ..order.topology import Topology
from .documents import DocumentColumns
from .options import BatchOptions, ReadAheadOptions
from .pipeline import BatchPipeline, default_decode_threads
from .stream import RankStream

__all__ = ["ShareReader", "prepare_workers_soon"]


class ShareReader:
    """The batches ``[start_cursor, ...)`` of one rank, for the whole rank or one worker.

    ``num_batches=None`` is endless (epochs follow each other, each a fresh permutation).
    ``end``: no position at or past it is read; the step that would cross it is short.
    ``split``: this process's share of each step by another rule than the topology's rank
    rule (a live run's participant, :class:`~zephon_store.load.live.Participant`).
    """

    def __init__(self, dataset, order_options: OrderOptions, topology: Topology, *,
                 batch: BatchOptions | None = None, read_ahead: ReadAheadOptions | None = None,
                 start_cursor: int = 0, num_batches: int | None = None,
                 end: int | None = None, split=None) -> None:
        batch = batch or BatchOptions()
        columns = batch.read_columns()
        columns = None if columns is None else list(columns)
        self.stream = RankStream(dataset, order_options, topology, columns=columns,
                                 with_seq=batch.with_seq, end=end, split=split)
        self.batch = batch
        self.read_ahead = read_ahead or ReadAheadOptions()
        self.start_cursor = start_cursor
        self.num_batches = num_batches
        self._pipelines: list[BatchPipeline] = []

    @property
    def decodes(self) -> int:
        """Row-group decodes started by this reader's pipelines (for tests)."""
        return sum(p.decodes for p in self._pipelines)

    def __getstate__(self) -> dict:
        # A worker process gets the reader without the parent's pipelines (threads, locks).
        return {**self.__dict__, "_pipelines": []}

    @property
    def dataset(self):
        return self.stream.dataset

    def prepare_workers(self, context=None) -> None:
        """Call before starting worker processes with the multiprocessing ``context`` (a
        start method's name, a context, or None: the default one): if they are forked, each
        remote source's storage readies its client stack here once, so that the workers
        inherit it instead of each paying it
        (:meth:`~zephon_store.io.storage.Storage.prepare_fork`). Spawned workers import
        everything afresh: nothing to do."""
        if not _forks(context):
            return
        for _, part in self.dataset.parts():
            storage = getattr(part, "storage", None)
            if storage is not None:
                storage.prepare_fork()

    def step_row_groups(self, i: int):
        """Row groups local batch ``i`` reads (for the prefetcher)."""
        return self.stream.row_groups(
            step_cursor(self.start_cursor, i, self.stream.topology.global_batch))

    def prefetcher(self, *, stride: int = 1, offset: int = 0) -> Prefetcher:
        """A prefetcher over this reader's batches (``stride``/``offset``: one worker's share)."""
        def rgs(j: int):
            return self.step_row_groups(offset + j * stride)

        total = None
        if self.num_batches is not None:
            total = max(0, -(-(self.num_batches - offset) // stride))
        ra = self.read_ahead
        return self.dataset.prefetcher(
            rgs, budget_bytes=ra.prefetch_bytes, num_batches=total, coalesce=ra.coalesce)

    def pipeline(self, worker: int = 0, workers: int = 0, *,
                 stop: threading.Event | None = None,
                 transform: bool = True) -> BatchPipeline:
        """The batches of ``worker`` of ``workers`` (0: all of them), decoded ahead, in order.

        Setting ``stop`` ends the pipeline at its next step (the loader's close).
        ``transform=False`` leaves the batch options' transform to the caller.
        """
        # Process workers share the cores: on a local dataset each gets its share of them
        # (docs/benchmarks.md, "Why the code is shaped this way: loading").
        threads = default_decode_threads(self.dataset, workers=max(1, workers))
        pipeline = BatchPipeline(self.stream, self.start_cursor,
                                 batches_for_worker(worker, workers, 0, self.num_batches),
                                 transform=self.batch.transform if transform else None,
                                 ahead_bytes=self.read_ahead.decode_ahead_bytes,
                                 stop=stop, decode_threads=threads,
                                 deny_list=self.batch.deny_list,
                                 documents=(DocumentColumns.of(self.dataset)
                                            if self.batch.documents else None))
        self._pipelines.append(pipeline)
        return pipeline

    def batches(self, worker: int = 0, workers: int = 0) -> Iterator[tuple[int, dict]]:
        """``(i, batch)`` of the share, with the share's bytes fetched ahead when remote.

        The prefetcher learns what was consumed from the share's own count of batches, so
        it never runs more than its budget ahead of the consumer.
        """
        pipeline = self.pipeline(worker, workers)
        if self.dataset.cache is None:
            try:
                yield from pipeline
            finally:
                pipeline.cancel()
            return
        pre = self.prefetcher(stride=max(1, workers), offset=worker)
        try:
            for j, item in enumerate(pipeline):
                pre.consumed(j)
                yield item
        finally:
            pipeline.cancel()
            pre.close()


def prepare_workers_soon(dataset, context=None, storage_options=None) -> None:
    """As a loader starts, before its dataset is opened: if ``dataset`` is an S3 URL and
    the workers will be forked (``context`` as in :meth:`ShareReader.prepare_workers`),
    start readying the S3 client stack in a thread, overlapping the wait for the node's
    metadata (:func:`~zephon_store.io.storage.prepare_s3_for_fork_soon`)."""
    if isinstance(dataset, str) and "://" in dataset and _forks(context):
        Storage(dataset, storage_options=storage_options).prepare_fork(soon=True)


def _forks(context) -> bool:
    """Whether worker processes started with ``context`` are forked."""
    if context is None:   # without fixing it: the first of all is the platform default
        context = (multiprocessing.get_start_method(allow_none=True)
                   or multiprocessing.get_all_start_methods()[0])
    return (context if isinstance(context, str) else context.get_start_method()) == "fork"
