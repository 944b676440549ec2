"""An ``IterableDataset`` yielding one rank's batches from a start cursor.

Worker ``k`` of ``n`` makes local batches ``i`` with ``i % n == k``; torch's DataLoader
returns worker outputs round-robin, so the main process sees batches ``0, 1, 2, ...`` for
any ``num_workers``. Workers hold no state: everything follows from the start cursor.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterator

import torch.utils.data

from ..io.coalesce import CoalesceOptions
from ..io.prefetch import DEFAULT_PREFETCH_BYTES, Prefetcher
from ..load.pipeline import BatchPipeline, default_decode_threads
from ..load.stream import RankStream
from ..order.assign import batches_for_worker, step_cursor
from ..order.order import OrderOptions
from ..order.topology import Topology


class ZephonIterableDataset(torch.utils.data.IterableDataset):
    """Yields ``(i, batch)``: the local batch index (from ``start_cursor``) and the batch.

    ``num_batches=None`` is an endless stream (epochs follow each other, each a fresh
    permutation). ``end``: no position at or past it is read; the step that would cross it
    is short (``drop_last=False`` of :class:`zephon_store.torch.ZephonLoader`, which
    usually drives this).
    """

    def __init__(self, dataset, *, order: OrderOptions, topology: Topology, start_cursor: int = 0,
                 num_batches: int | None = None, columns: list[str] | None = None,
                 with_seq: bool = False, transform: Callable[[dict], dict] | None = None,
                 prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
                 decode_ahead_bytes: int | None = None,
                 coalesce: CoalesceOptions | None = None, end: int | None = None) -> None:
        super().__init__()
        self.stream = RankStream(dataset, order, topology, columns=columns, with_seq=with_seq,
                                 end=end)
        self.start_cursor = start_cursor
        self.num_batches = num_batches
        self.transform = transform
        self.prefetch_bytes = prefetch_bytes
        self.decode_ahead_bytes = decode_ahead_bytes
        self.coalesce = coalesce

    def step_row_groups(self, i: int):
        """Row groups local batch ``i`` reads (for the prefetcher)."""
        return self.stream.row_groups(
            step_cursor(self.start_cursor, i, self.stream.topology.global_batch))

    def prefetcher(self, *, stride: int = 1, offset: int = 0) -> Prefetcher:
        """A prefetcher over this source's batches (``stride``/``offset``: one worker's share)."""
        def rgs(j: int):
            return self.step_row_groups(offset + j * stride)

        total = None
        if self.num_batches is not None:
            total = max(0, -(-(self.num_batches - offset) // stride))
        return self.stream.dataset.row_groups.prefetcher(
            rgs, budget_bytes=self.prefetch_bytes, num_batches=total, coalesce=self.coalesce)

    def pipeline(self, worker: int = 0, workers: int = 0, *,
                 stop: threading.Event | None = None) -> BatchPipeline:
        """The batches of ``worker`` of ``workers`` (0: all of them), decoded ahead, in order.

        Setting ``stop`` ends the pipeline at its next step (the loader's close).
        """
        # Process workers share the cores: on a local dataset each gets its share of them
        # (2 workers on 2 cores: 0.75-0.80 s per text pass with one decode thread each,
        # 0.89-0.91 s with two; tools/bench/peers loader_w2).
        threads = default_decode_threads(self.stream.dataset, workers=max(1, workers))
        return BatchPipeline(self.stream, self.start_cursor,
                             batches_for_worker(worker, workers, 0, self.num_batches),
                             transform=self.transform, ahead_bytes=self.decode_ahead_bytes,
                             stop=stop, decode_threads=threads)

    def __iter__(self) -> Iterator[tuple[int, dict]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            # A forked worker inherits the parent's Dataset, including its I/O thread pool
            # (whose threads did not survive the fork: reads would wait forever) and locks
            # a parent thread may have held. A copy goes through __getstate__/__setstate__
            # and gets fresh ones; the manifest is shared, not reloaded.
            self.stream.dataset = copy.copy(self.stream.dataset)
        pipeline = self.pipeline(worker, workers if info is not None else 0)
        if self.stream.dataset.cache is None:
            yield from pipeline
            return
        # Remote data: this worker's share is also fetched ahead, in coalesced ranges.
        pre = self.prefetcher(stride=max(1, workers), offset=worker)
        try:
            for j, item in enumerate(pipeline):
                pre.consumed(j)
                yield item
        finally:
            pre.close()
