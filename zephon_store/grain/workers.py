"""Grain's process workers making a loader's batches, in Zephon's worker rule.

Worker ``k`` of ``n`` makes local batches ``i`` with ``i % n == k`` (the rule of
:func:`~zephon_store.order.assign.batches_for_worker`, the torch loader's too), and Grain's
process prefetch hands its workers' outputs out round-robin, so the loop sees batches
``0, 1, 2, ...`` for any number of workers. Workers hold no state: each one's share follows
from the reader's start cursor, and the cursor lives with the loader in the main process.
"""

from __future__ import annotations

from collections.abc import Iterator

import grain

from .._util.parent_watch import exit_with_parent
from ..load.options import WorkerOptions
from ..load.share_reader import ShareReader

__all__ = ["worker_batches"]

_KEY_BATCHES = "batches"


class _ShareBatches(grain.IterDataset):
    """One reader's ``(i, batch)``; Grain's process prefetch slices it among its workers."""

    def __init__(self, reader: ShareReader) -> None:
        super().__init__()
        self.reader = reader
        self.worker, self.workers = 0, 0   # 0 workers: every batch (no slice set)

    def set_slice(self, sl: slice, sequential_slice: bool = False) -> None:
        """Worker ``sl.start`` of ``sl.step``: Grain's strided slice is Zephon's worker rule
        (a sequential slice is not: it would change which batch comes when)."""
        if sequential_slice:
            raise ValueError("zephon_store.grain: sequential_slice=True would hand each "
                             "worker consecutive batches and change the order; leave it False")
        self.worker, self.workers = int(sl.start or 0), int(sl.step or 1)

    def __iter__(self) -> _ShareIterator:
        return _ShareIterator(self)


class _ShareIterator(grain.DatasetIterator):
    """A worker's batches; its only state is how many it made (set only to a fresh start:
    a resume is the loader's, which builds a new pipeline from its cursor)."""

    def __init__(self, share: _ShareBatches) -> None:
        super().__init__()
        self._share = share
        self._batches = None
        self._made = 0

    def __next__(self):
        if self._batches is None:
            # Each batch with this worker's account of it, for the loader's (observe/).
            self._batches = self._share.reader.batches(self._share.worker, self._share.workers,
                                                       notes=bool(self._share.workers))
        item = next(self._batches)
        self._made += 1
        return item

    def get_state(self) -> dict:
        return {_KEY_BATCHES: self._made}

    def set_state(self, state: dict) -> None:
        if state.get(_KEY_BATCHES) != self._made:
            raise ValueError(f"a zephon_store.grain worker resumes only from its start, got "
                             f"{state!r}; resume the ZephonIterDataset's iterator instead "
                             "(its state is the one cursor)")

    def close(self) -> None:
        batches, self._batches = self._batches, None
        if batches is not None:
            batches.close()
        super().close()


def worker_batches(reader: ShareReader, workers: WorkerOptions) -> Iterator[tuple[int, dict]]:
    """The reader's ``(i, batch)`` in order, made by ``workers.num_workers`` Grain worker
    processes, each up to ``workers.prefetch`` batches ahead; closing this generator stops
    them."""
    options = grain.MultiprocessingOptions(num_workers=workers.num_workers,
                                           per_worker_buffer_size=workers.prefetch)
    # Grain's workers stop only when told to: a killed rank would leave them running.
    it = iter(_ShareBatches(reader).mp_prefetch(options, worker_init_fn=exit_with_parent))
    try:
        yield from it
    finally:
        it.close()
